"""The linear family's ``matmul`` (a product of two arrays) by each CUDA provider, in one run.

    python benchmarks/matmul_bench.py [--lanes 1,8] [--tokens 1024,8192] [--json OUT.json]

On the products of one GLM5Next decode step's layers (64 heads, kv_rank 512, 256-wide heads,
an indexer of 32 heads of 128 over pools of 16 tokens, 4 streams of 4,096): the absorbed
queries and the value expansion of a latent attention layer, its indexer's scores, the
latent attention's scores and its mix of latents over a lane's tokens, and a hyper-connection's
mixing of the streams; each at 1 and 8 lanes, the attention's at each token count. Per
product, ours (``nvrtc``: what a captured step runs) and cuBLAS (``reference``: what an eager
step runs) by device time (``device_ms``: calls queued behind a spinning kernel, so launches
do not count) and the largest error against float64, beside two floors measured in the same
run: the operands read and the output written once at the device-to-device copy rate, and the
product's FLOPs at the fp16 matmul rate.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import cupy as cp
import numpy as np
from gpu_bench import copy_bandwidth, device_ms

from ninfer_runtime.bench.measure import matmul_rate
from ninfer_runtime.ops.linear import nvrtc, reference

HEADS, RANK, HEAD, INDEX_HEADS, INDEX_DIM, KPOOL, STREAMS, HIDDEN = (
    64, 512, 256, 32, 128, 16, 4, 4096,
)  # fmt: skip


def products(n: int, tokens: int) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], bool, bool]]:
    """name -> (a's shape, b's shape, a stored transposed, b stored transposed), as the model
    hands them over (views of the arrays it holds)."""
    pools = tokens // KPOOL
    return {
        f"absorb n={n}": ((HEADS, n, HEAD), (HEADS, HEAD, RANK), True, False),
        f"value n={n}": ((HEADS, n, RANK), (HEADS, RANK, HEAD), True, True),
        f"index n={n} S={tokens}": (
            (n, INDEX_HEADS, INDEX_DIM),
            (n, INDEX_DIM, pools),
            False,
            True,
        ),
        f"scores n={n} S={tokens}": ((n, HEADS, RANK), (n, RANK, tokens), False, True),
        f"mix n={n} S={tokens}": ((n, HEADS, tokens), (n, tokens, RANK), False, False),
        f"streams n={n}": ((n, STREAMS, STREAMS), (n, STREAMS, HIDDEN), True, False),
    }


def operand(shape: tuple[int, ...], transposed: bool, rng: np.random.Generator) -> cp.ndarray:
    host = rng.standard_normal(shape).astype(np.float32)
    if not transposed:
        return cp.asarray(host)
    return cp.ascontiguousarray(cp.asarray(host).swapaxes(-1, -2)).swapaxes(-1, -2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lanes", default="1,8")
    parser.add_argument("--tokens", default="1024,8192")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    bandwidth, _ = copy_bandwidth()
    flops = matmul_rate(cp)
    print(f"copy rate {bandwidth / 1e9:.0f} GB/s, fp16 matmul {flops / 1e12:.0f} TFLOP/s")
    print(f"{'product':<24}{'bytes floor':>12}{'flop floor':>12}{'ours':>10}{'cuBLAS':>10}"
          f"{'floor/ours':>12}{'err ours':>10}")  # fmt: skip
    rows, seen = [], set()
    for n in (int(x) for x in args.lanes.split(",")):
        for tokens in (int(x) for x in args.tokens.split(",")):
            for name, (sa, sb, ta, tb) in products(n, tokens).items():
                if name in seen:  # a product that does not depend on the tokens
                    continue
                seen.add(name)
                rng = np.random.default_rng(len(rows))
                a, b = operand(sa, ta, rng), operand(sb, tb, rng)
                out_size = max(sa[0] if len(sa) == 3 else 1, sb[0]) * sa[-2] * sb[-1]
                moved = 4 * (a.size + b.size + out_size)
                work = 2 * out_size * sa[-1]
                floor = max(moved / bandwidth, work / flops) * 1e3
                ours, _ = device_ms(lambda a=a, b=b: nvrtc.matmul(a, b))
                cublas, _ = device_ms(lambda a=a, b=b: reference.matmul(a, b))
                want = np.matmul(cp.asnumpy(a).astype(np.float64), cp.asnumpy(b).astype(np.float64))
                err = float(
                    np.abs(cp.asnumpy(nvrtc.matmul(a, b)) - want).max() / np.abs(want).max()
                )
                rows.append({"product": name, "bytes_floor_ms": moved / bandwidth * 1e3,
                             "flop_floor_ms": work / flops * 1e3, "ours_ms": ours,
                             "cublas_ms": cublas, "error": err})  # fmt: skip
                print(f"{name:<24}{moved / bandwidth * 1e3:>12.4f}{work / flops * 1e3:>12.4f}"
                      f"{ours:>10.4f}{cublas:>10.4f}{floor / ours:>11.0%}{err:>10.1e}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"bandwidth": bandwidth, "flops": flops, "rows": rows}))


if __name__ == "__main__":
    main()
