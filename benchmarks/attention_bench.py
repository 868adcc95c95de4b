"""Decode attention over a paged K/V pool against the memory-bandwidth floor of the device.

    python benchmarks/attention_bench.py [--lanes 8] [--context 16384] [--chunks 64,128,256]

The 27B attention shape (4 kv heads, 6 query heads each, D = 256), every lane at the same
context, K/V stored as float32, bf16 and E4M3. Bytes per call are the K and V rows read; the
floor is those bytes at a measured device-to-device copy rate (``gpu_bench.copy_bandwidth``).
Each chunk (tokens per split) is timed inside a CUDA graph; "policy" is ``split_policy``'s.
"""

from __future__ import annotations

import argparse

import cupy as cp
from gpu_bench import copy_bandwidth, median_ms

from ninfer_runtime.backends.cuda import attention

KV_HEADS, GROUP, HEAD_DIM, PAGE = 4, 6, 256, 64


def pool(dtype: str, pages: int, kv_heads: int = KV_HEADS, page: int = PAGE) -> cp.ndarray:
    """Random finite K or V pages of one storage type."""
    shape = (pages, page, kv_heads, HEAD_DIM)
    values = cp.random.standard_normal(shape, dtype=cp.float32)
    if dtype == "float32":
        return values
    if dtype == "bfloat16":
        return (values.view(cp.uint32) >> 16).astype(cp.uint16)
    codes = cp.random.randint(0, 0x7F, shape, dtype=cp.int32)  # E4M3FN without NaN
    return (codes | (cp.random.randint(0, 2, shape, dtype=cp.int32) << 7)).astype(cp.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--context", type=int, default=16384)
    parser.add_argument("--chunks", default="64,128,256,512,1024")
    args = parser.parse_args()
    copy_bps, _ = copy_bandwidth()
    n, ctx = args.lanes, args.context
    per_lane = -(-ctx // PAGE)
    table = cp.arange(n * per_lane, dtype=cp.int32).reshape(n, per_lane)
    slots = cp.arange(n, dtype=cp.int32)
    positions = cp.full(n, ctx - 1, dtype=cp.int32)
    q = cp.random.standard_normal((n, KV_HEADS * GROUP, HEAD_DIM), dtype=cp.float32)
    print(f"lanes {n}, context {ctx}, copy {copy_bps / 1e9:.0f} GB/s")
    print(f"{'K/V':<9} {'chunk':>7} {'us':>8} {'GB/s':>7} {'floor us':>9} {'% floor':>8}")
    policy = attention.split_policy(per_lane * PAGE, n * KV_HEADS)[0]
    for dtype in ("float32", "bfloat16", "fp8_e4m3"):
        k, v = pool(dtype, n * per_lane), pool(dtype, n * per_lane)
        nbytes = 2 * n * ctx * KV_HEADS * HEAD_DIM * k.itemsize
        floor_us = nbytes / copy_bps * 1e6
        for chunk in [None, *(int(c) for c in args.chunks.split(","))]:
            ms = median_ms(
                lambda: attention.attention_decode(q, k, v, table, slots, positions, 0.0625, chunk)  # noqa: B023
            )
            label = f"{chunk or policy} {'(policy)' if chunk is None else ''}"
            print(
                f"{dtype:<9} {label:>16} {ms * 1e3:8.1f} {nbytes / ms / 1e6:7.0f} "
                f"{floor_us:9.1f} {100 * floor_us / (ms * 1e3):7.1f}%",
                flush=True,
            )


if __name__ == "__main__":
    main()
