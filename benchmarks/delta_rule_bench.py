"""The delta rule's chunked prefill (op family ``delta_rule``), each CUDA provider in one run.

    python benchmarks/delta_rule_bench.py [--tokens 64,256,1024,2048] [--json OUT.json]

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
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import cupy as cp
import numpy as np
from gpu_bench import copy_bandwidth, eager_ms

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
    rows = []
    for shape, (op, hk, hv, dk, dv, layers) in SHAPES.items():
        table = registry.providers("delta_rule")[op]
        names = [
            n for n in policy.TABLE[(op, "cuda")]
            if table[n].available() and (op == "kda_chunk" or n != "reference")
        ]  # fmt: skip
        for t in (int(x) for x in args.tokens.split(",")):
            host = inputs(op, t, hk, hv, dk, dv)
            want_state = host[5].astype(np.float64)
            want = ORACLE[op](*(a.astype(np.float64) for a in host[:5]), want_state)
            moved = sum(a.nbytes for a in host[:5]) + 4 * t * hv * dv + 2 * host[5].nbytes
            floor = max(moved / bandwidth, chunk_flops(t, hv, dk, dv) / rate) * 1e3
            for name in names:
                fn = table[name].load()
                arrays = [cp.asarray(a) for a in host]
                out = fn(*arrays[:5], arrays[5].copy())
                err = float(np.abs(cp.asnumpy(out) - want).max() / max(np.abs(want).max(), 1e-30))
                ms = eager_ms(lambda fn=fn, arrays=arrays: fn(*arrays))
                rows.append(
                    {"shape": shape, "op": op, "tokens": t, "provider": name, "ms": ms,
                     "floor_ms": floor, "per_prefill_ms": ms * layers, "max_rel_err": err}
                )  # fmt: skip
                print(
                    f"{shape:<8} {t:>5} {name:<9} {ms:>8.3f} {floor:>9.3f} "
                    f"{100 * floor / ms:>7.1f}% {ms * layers:>15.2f} {err:>12.2e}"
                )
    if args.json:
        args.json.write_text(json.dumps({"bandwidth": bandwidth, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
