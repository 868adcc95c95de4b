"""The delta rule's chunked prefill (op family ``delta_rule``), each CUDA provider in one run.

    python benchmarks/delta_rule_bench.py [--tokens 64,256,1024,2048] [--json OUT.json]
        [--prefill-only]

Per model shape (the 27B's 16 key / 48 value heads, the 35B-A3B's 16 / 32, head size 128; and
GLM5Next's KDA layers, 64 heads of 128 with a decay per key channel, op ``kda_chunk``) and
chunk length, each installed provider (ours, ``nvrtc``; flash-linear-attention's, ``fla``;
for KDA also the reference, the array math that serves it where no kernel does) runs
one layer's chunk (q, k, v, g, beta float32, state carried in) as the engine calls it: eager,
host launches included (prefill is not captured in a graph), the median of 10 calls after
warm-up, timed with CUDA events. Beside it two floors measured in the same run: the bytes the
op must move (inputs and output once, the state read and written) at the device-to-device
copy rate, and the chunked form's products (per 64-token chunk and value head: K Kᵀ, Q Kᵀ, the
WY factors W and U, the intra-chunk outputs, and three state products) at the fp16 matmul
rate; and each provider's largest error against the float64 reference. ``per prefill``
is the time of all the shape's linear-attention layers for a chunk (48 on the 27B, 30 on the
35B-A3B, 34 on GLM5Next).

Then the ``prefill`` op as the engine's recurrent layers call it (the [q | k | v] channels
through the convolution and the delta rule, states in slots) on the GDN shapes, for one lane
of 256 and 2,048 rows and for seven lanes of 131 rows in one call (the prefix cache's packed
follower step), by each CUDA provider, in the policy or not: eager as above, and by device
time (``device_ms``: the calls queued behind a spinning kernel, so the device runs them back
to back; what a call costs a chunk whose host is ahead, as the 27B's is) with the host's time
to issue one; and the largest error against the reference in float64.

Then GLM5Next's KDA decode step (``kda_decode``: the convolution step, SiLU, the q/k
normalisation and the delta rule with a decay a key channel, states by slot) at 1 and 8
lanes by each provider in its policy row, eager and by device time as above, beside its floor
(the states read and written, the inputs and output once, at the copy rate) and the step's
share (times its 34 KDA layers).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import cupy as cp
import numpy as np
from gpu_bench import copy_bandwidth, device_ms, eager_ms

from ninfer_runtime.bench.measure import matmul_rate
from ninfer_runtime.ops import registry
from ninfer_runtime.ops.delta_rule import kda_reference as KDA
from ninfer_runtime.ops.delta_rule import policy
from ninfer_runtime.ops.delta_rule import reference as R

#: shape -> (op, key heads, value heads, dk, dv, linear-attention layers)
SHAPES = {
    "27b": ("chunk", 16, 48, 128, 128, 48),
    "35b-a3b": ("chunk", 16, 32, 128, 128, 30),
    "glm5next": ("kda_chunk", 64, 64, 128, 128, 34),
}
#: op -> the float64 oracle
ORACLE = {"chunk": R.chunk, "kda_chunk": KDA.kda_chunk}


def inputs(op: str, t: int, hk: int, hv: int, dk: int, dv: int) -> tuple[np.ndarray, ...]:
    """q, k, v, g, beta, state; g a log-decay per value head (``chunk``) or per key channel as
    GLM5Next bounds it, in [-5, 0) (``kda_chunk``)."""
    rng = np.random.default_rng(t)
    q = rng.standard_normal((t, hk, dk))
    q /= np.linalg.norm(q, axis=-1, keepdims=True) * dk**0.5
    k = rng.standard_normal((t, hk, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((t, hv, dv))
    if op == "chunk":
        g = -np.log1p(np.exp(rng.standard_normal((t, hv)))) * 0.3
    else:
        g = -5 / (1 + np.exp(3 - 2 * rng.standard_normal((t, hv, dk))))
    beta = 1 / (1 + np.exp(-rng.standard_normal((t, hv))))
    state = rng.standard_normal((hv, dk, dv)) * 0.5
    return tuple(a.astype(np.float32) for a in (q, k, v, g, beta, state))


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """The largest difference over the largest value of the oracle's output."""
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def chunk_flops(t: int, hv: int, dk: int, dv: int, chunk: int = 64) -> int:
    """Multiply-adds x 2 of the chunked delta rule's products for ``t`` tokens: per chunk and
    value head K Kᵀ, Q Kᵀ and W (C² dk each), U and the intra-chunk output (C² dv each), and
    the state's three products (W S, Kᵀ U, Q S: C dk dv each)."""
    chunks = -(-t // chunk)
    per = 3 * chunk * chunk * dk + 2 * chunk * chunk * dv + 3 * chunk * dk * dv
    return 2 * per * chunks * hv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="64,256,1024,2048")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--prefill-only", action="store_true", help="the prefill op's rows only")
    args = parser.parse_args()
    bandwidth, _ = copy_bandwidth()
    rate = matmul_rate(cp)
    print(
        f"device-to-device copy {bandwidth / 1e9:.0f} GB/s, fp16 matmul {rate / 1e12:.0f} TFLOP/s"
    )
    print(
        f"{'shape':<8} {'T':>5} {'provider':<9} {'ms':>8} {'floor ms':>9} {'% floor':>8} "
        f"{'per prefill ms':>15} {'max rel err':>12}"
    )
    rows = [] if args.prefill_only else chunk_rows(args.tokens, bandwidth, rate)
    rows += prefill_rows()
    if not args.prefill_only:
        rows += kda_decode_rows(bandwidth)
    if args.json:
        args.json.write_text(json.dumps({"bandwidth": bandwidth, "rows": rows}, indent=2))


def chunk_rows(tokens: str, bandwidth: float, rate: float) -> list[dict]:
    rows = []
    for shape, (op, hk, hv, dk, dv, layers) in SHAPES.items():
        table = registry.providers("delta_rule")[op]
        names = [
            n for n in policy.TABLE[(op, "cuda")]
            if table[n].available() and (op == "kda_chunk" or n != "reference")
        ]  # fmt: skip
        for t in (int(x) for x in tokens.split(",")):
            host = inputs(op, t, hk, hv, dk, dv)
            want_state = host[5].astype(np.float64)
            want = ORACLE[op](*(a.astype(np.float64) for a in host[:5]), want_state)
            moved = sum(a.nbytes for a in host[:5]) + 4 * t * hv * dv + 2 * host[5].nbytes
            floor = max(moved / bandwidth, chunk_flops(t, hv, dk, dv) / rate) * 1e3
            for name in names:
                fn = table[name].load()
                arrays = [cp.asarray(a) for a in host]
                out = fn(*arrays[:5], arrays[5].copy())
                err = rel_err(cp.asnumpy(out), want)
                ms = eager_ms(lambda fn=fn, arrays=arrays: fn(*arrays))
                rows.append(
                    {"shape": shape, "op": op, "tokens": t, "provider": name, "ms": ms,
                     "floor_ms": floor, "per_prefill_ms": ms * layers, "max_rel_err": err}
                )  # fmt: skip
                print(
                    f"{shape:<8} {t:>5} {name:<9} {ms:>8.3f} {floor:>9.3f} "
                    f"{100 * floor / ms:>7.1f}% {ms * layers:>15.2f} {err:>12.2e}"
                )
    return rows


#: prefill cases: (name, rows of each lane)
PREFILL_CASES = (("1x256", (256,)), ("1x2048", (2048,)), ("7x131", (131,) * 7))


def prefill_rows() -> list[dict]:
    """The ``prefill`` op of the GDN shapes by each CUDA provider (eager, and device time)."""
    print(
        f"\nprefill: {'shape':<8} {'lanes':<7} {'provider':<9} {'eager ms':>9} {'device ms':>10} "
        f"{'host ms':>8} {'per prefill device ms':>22} {'max rel err':>12}"
    )
    table = registry.providers("delta_rule")["prefill"]  # the policy's and those only forced
    names = [n for n, p in table.items() if n != "reference" and p.available()]
    rows = []
    for shape, (op, hk, hv, dk, dv, layers) in SHAPES.items():
        if op != "chunk":
            continue
        dims = {"key_heads": hk, "key_dim": dk, "value_heads": hv, "value_dim": dv}
        for case, lengths in PREFILL_CASES:
            host, segments = prefill_inputs(lengths, hk, hv, dk, dv)
            want = _reference_prefill(host, segments, dims)
            for name in names:
                fn = table[name].load()
                arrays = [cp.asarray(a) for a in host]
                mixed, kernel, g, beta, conv, states = arrays
                out = fn(mixed, kernel, conv.copy(), g, beta, states.copy(), segments, **dims)
                got = np.concatenate([cp.asnumpy(out[a : a + n]) for a, n, _ in segments])
                err = rel_err(got, want)

                def call(fn=fn, arrays=arrays, segments=segments, dims=dims) -> None:
                    mixed, kernel, g, beta, conv, states = arrays
                    fn(mixed, kernel, conv, g, beta, states, segments, **dims)

                eager = eager_ms(call)
                device, issue = device_ms(call)
                rows.append(
                    {"shape": shape, "op": "prefill", "lanes": case, "provider": name,
                     "eager_ms": eager, "device_ms": device, "host_ms": issue,
                     "per_prefill_device_ms": device * layers, "max_rel_err": err}
                )  # fmt: skip
                print(
                    f"prefill: {shape:<8} {case:<7} {name:<9} {eager:>9.3f} {device:>10.3f} "
                    f"{issue:>8.3f} {device * layers:>22.2f} {err:>12.2e}"
                )
    return rows


def kda_decode_rows(bandwidth: float) -> list[dict]:
    """GLM5Next's ``kda_decode`` by each provider of its CUDA policy row, at 1 and 8 lanes."""
    _, h, _, d, _, layers = SHAPES["glm5next"]
    print(
        f"\nkda_decode: {'lanes':>5} {'provider':<9} {'eager ms':>9} {'device ms':>10} "
        f"{'floor ms':>9} {'per step device ms':>19} {'max rel err':>12}"
    )
    table = registry.providers("delta_rule")["kda_decode"]
    dims, channels, rows = {"heads": h, "head_dim": d}, 3 * h * d, []
    for lanes in (1, 8):
        rng = np.random.default_rng(lanes)
        host = (
            rng.standard_normal((lanes, channels)),
            rng.standard_normal((4, channels)) * 0.5,
            rng.standard_normal((lanes, channels, 3)),
            -5 / (1 + np.exp(3 - 2 * rng.standard_normal((lanes, h, d)))),
            1 / (1 + np.exp(-rng.standard_normal((lanes, h)))),
            rng.standard_normal((lanes, h, d, d)) * 0.5,
        )
        host = tuple(a.astype(np.float32) for a in host)
        slots = np.arange(lanes, dtype=np.int32)
        f64 = [a.astype(np.float64) for a in host]
        want = KDA.kda_decode(*f64, slots, **dims)
        moved = sum(a.nbytes for a in host) + host[5].nbytes + 4 * lanes * h * d
        floor = moved / bandwidth * 1e3
        for name in policy.TABLE[("kda_decode", "cuda")]:
            if not table[name].available():
                continue
            fn = table[name].load()
            arrays = [cp.asarray(a) for a in host] + [cp.asarray(slots)]
            mixed, kernel, conv, g, beta, states, at = arrays
            out = fn(mixed, kernel, conv.copy(), g, beta, states.copy(), at, **dims)
            err = rel_err(cp.asnumpy(out), want)

            def call(fn=fn, arrays=arrays) -> None:
                mixed, kernel, conv, g, beta, states, at = arrays
                fn(mixed, kernel, conv, g, beta, states, at, **dims)

            eager = eager_ms(call)
            device, _ = device_ms(call)
            rows.append(
                {"shape": "glm5next", "op": "kda_decode", "lanes": lanes, "provider": name,
                 "eager_ms": eager, "device_ms": device, "floor_ms": floor,
                 "per_step_device_ms": device * layers, "max_rel_err": err}
            )  # fmt: skip
            print(
                f"kda_decode: {lanes:>5} {name:<9} {eager:>9.3f} {device:>10.3f} {floor:>9.4f} "
                f"{device * layers:>19.2f} {err:>12.2e}"
            )
    return rows


def prefill_inputs(
    lengths: tuple[int, ...], hk: int, hv: int, dk: int, dv: int
) -> tuple[tuple[np.ndarray, ...], tuple[tuple[int, int, int], ...]]:
    """(mixed, kernel, g, beta, conv states, states) float32 and the segments: lane i's
    rows stacked in order, in slot ``len(lengths) - 1 - i`` (slots out of row order)."""
    rng = np.random.default_rng(sum(lengths))
    n, channels, lanes = sum(lengths), 2 * hk * dk + hv * dv, len(lengths)
    starts = np.cumsum((0, *lengths[:-1]))
    segments = tuple((int(starts[i]), count, lanes - 1 - i) for i, count in enumerate(lengths))
    host = (
        rng.standard_normal((n, channels)),
        rng.standard_normal((4, channels)) * 0.5,
        -np.log1p(np.exp(rng.standard_normal((n, hv)))) * 0.3,
        1 / (1 + np.exp(-rng.standard_normal((n, hv)))),
        rng.standard_normal((lanes, channels, 3)),
        rng.standard_normal((lanes, hv, dk, dv)) * 0.5,
    )
    return tuple(a.astype(np.float32) for a in host), segments


def _reference_prefill(host: tuple[np.ndarray, ...], segments: tuple, dims: dict) -> np.ndarray:
    """The segments' rows of the reference's prefill in float64, stacked in segment order."""
    mixed, kernel, g, beta, conv, states = (a.astype(np.float64) for a in host)
    out = R.prefill(mixed, kernel, conv, g, beta, states, segments, **dims)
    return np.concatenate([out[a : a + n] for a, n, _ in segments])


if __name__ == "__main__":
    main()
