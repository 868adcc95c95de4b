"""Causal prefill attention of one chunk over a paged K/V pool against the tensor-core floor.

    python benchmarks/prefill_attention_bench.py [--tokens 2048] [--starts 0,2048,6144,129024]

The 27B (4 kv heads of 6 query heads) and 35B-A3B (2 of 8) attention shapes, D = 256: a chunk
of ``--tokens`` queries at each start over K/V pages stored as float32 and bf16, in each
prefill precision. A chunk at ``start`` does 4 D Nq FLOPs per (query, visible key) pair (Q·Kᵀ
and P·V, one multiply-add each) over ``T start + T (T + 1) / 2`` pairs; the floor is those
FLOPs at the fp16 matmul rate measured in the same run. Each call is timed inside a CUDA graph.
With ``--library`` each bf16 row is followed by the attention family's library providers
(``sdpa``: torch's fused attention on the lane's gathered bf16 K/V) and ours, both timed eagerly
with CUDA events (a library's launches cannot be captured into CuPy's graph), so the two are
compared as the engine calls them.
"""

from __future__ import annotations

import argparse
import functools

import cupy as cp
from attention_bench import HEAD_DIM, pool
from gpu_bench import eager_ms, median_ms

from ninfer_runtime.backends.cuda import prefill_attention as pfa
from ninfer_runtime.bench.measure import matmul_rate
from ninfer_runtime.ops import registry

#: shape -> (kv heads, query heads per kv head)
SHAPES = {"27b": (4, 6), "35b-a3b": (2, 8)}
PAGE = 256  # the pool's
STORAGE = ("float32", "bfloat16")


def flops(nq: int, tokens: int, start: int) -> int:
    return 4 * HEAD_DIM * nq * (tokens * start + tokens * (tokens + 1) // 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--starts", default="0,2048,6144,129024")
    parser.add_argument("--precisions", default="bf16,split_qk")
    parser.add_argument(
        "--library", action="store_true", help="also time the library providers (bf16 rows)"
    )
    args = parser.parse_args()
    rate = matmul_rate(cp)
    t = args.tokens
    starts = [int(s) for s in args.starts.split(",")]
    print(f"chunk of {t} queries, D {HEAD_DIM}, fp16 matmul {rate / 1e12:.0f} TFLOP/s")
    print(
        f"{'shape':<8} {'K/V':<9} {'precision':<9} {'start':>7} {'ms':>8} {'TFLOP/s':>8} "
        f"{'floor ms':>9} {'% floor':>8}"
    )
    for shape, (nkv, group) in SHAPES.items():
        nq = nkv * group
        q = cp.random.standard_normal((t, nq, HEAD_DIM), dtype=cp.float32)
        count = -(-(max(starts) + t) // PAGE)
        page_ids = cp.random.permutation(count).astype(cp.int32)
        for dtype in STORAGE:
            k, v = pool(dtype, count, nkv, PAGE), pool(dtype, count, nkv, PAGE)
            for precision in args.precisions.split(","):
                for start in starts:
                    call = functools.partial(
                        pfa.prefill_attention,
                        q,
                        k,
                        v,
                        page_ids,
                        start=start,
                        scale=0.0625,
                        precision=precision,
                    )
                    ms = median_ms(call, reps=10)
                    work = flops(nq, t, start)
                    floor_ms = work / rate * 1e3
                    print(
                        f"{shape:<8} {dtype:<9} {precision:<9} {start:>7} {ms:8.3f} "
                        f"{work / ms / 1e9:8.1f} {floor_ms:9.3f} {100 * floor_ms / ms:7.1f}%",
                        flush=True,
                    )
                    if args.library and precision == "bf16":
                        for name in ("nvrtc", "sdpa"):
                            provider = registry.providers("attention")["prefill"][name]
                            if not provider.available():
                                continue
                            fn = functools.partial(
                                provider.load(), q, k, v, page_ids, start=start,
                                scale=0.0625, precision="bf16",
                            )  # fmt: skip
                            ms = eager_ms(fn)
                            print(
                                f"{'':<8} {'':<9} {name + ' eager':<9} {start:>7} {ms:8.3f} "
                                f"{work / ms / 1e9:8.1f} {floor_ms:9.3f} "
                                f"{100 * floor_ms / ms:7.1f}%",
                                flush=True,
                            )


if __name__ == "__main__":
    main()
