"""Launchers for the packed-weight kernels: GEMV (M <= 8) and row dequantization.

Kernels are compiled lazily, one family (one ``.cu`` file) at a time, on first use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import formats as F
from .compile import compile_all, function, register_family

MAX_GEMV_ROWS = 8
#: must match GEMV_WARPS in kernels/gemv.cuh
GEMV_WARPS = 4
#: output rows per warp (the R template argument) compiled for each activation count M
ROWS_PER_WARP = dict.fromkeys(range(1, MAX_GEMV_ROWS + 1), 4)
#: K split ways (KS): 1, or every warp of the block on the same rows
K_SPLITS = (1, GEMV_WARPS)
#: extra (M, R, KS) instantiations: single-row choices below, and what the benchmark compares
TUNING = [(1, 1, 1), (1, 2, 1), (1, 8, 1), (8, 1, 1), (8, 2, 1), (1, 2, 4), (1, 8, 4)]


def default_rows_per_warp(code: int, m: int, rows: int, k_split: int) -> int:
    """R for one launch, from ``benchmarks/gpu_bench.py --tune`` on the H200 (2026-11-29,
    [17408, 5120] and [5120, 17408]): with one activation row, the integer row_split layouts
    keep more loads in flight with 8 rows per warp, nvfp4 and fp8 with few rows did best
    with 2; with several activation rows R = 4 was best for every layout."""
    if m > 1:
        return ROWS_PER_WARP[m]
    if code == F.NVFP4:
        return 2
    if code == F.FP8:
        return 8 if rows >= 16384 and k_split == 1 else 2
    if code == F.BF16:
        return 4
    if code == F.Q8 and k_split == 1:
        return 2 if rows < 16384 else 8
    return 8 if rows >= 16384 or k_split > 1 else 4


def default_k_split(rows: int, units: int) -> int:
    """Split K over the block's warps when rows are few and long (too few warps otherwise)."""
    return GEMV_WARPS if rows < 8192 and units >= 128 else 1


_GEMV_KERNELS = {
    F.Q4: ("gemv_row_split", "gemv_q4"),
    F.Q5: ("gemv_row_split", "gemv_q5"),
    F.Q6: ("gemv_row_split", "gemv_q6"),
    F.Q8: ("gemv_row_split", "gemv_q8"),
    F.NF4: ("gemv_row_split", "gemv_nf4"),
    F.NVFP4: ("gemv_nvfp4", "gemv_nvfp4"),
    F.FP8: ("gemv_fp8", "gemv_fp8"),
    F.BF16: ("gemv_bf16", "gemv_bf16"),
}
#: every compiled (M, R, KS) GEMV configuration
GEMV_CONFIGS = sorted(
    {(m, r, ks) for m, r in ROWS_PER_WARP.items() for ks in K_SPLITS} | set(TUNING)
)
for _family, _kernel in _GEMV_KERNELS.values():
    register_family(_family, [f"{_kernel}<{m}, {r}, {ks}>" for m, r, ks in GEMV_CONFIGS])
register_family("dequant", [f"dequant_rows<{code}>" for code in sorted(_GEMV_KERNELS)])

__all__ = ["compile_all", "dequant_rows", "gemv"]


def gemv(
    data: Any,
    p: F.Planes,
    row0: int,
    rows: int,
    x: Any,
    y: Any,
    ldy: int,
    rows_per_warp: int | None = None,
    k_split: int | None = None,
) -> None:
    """``y[m, r] = Σ_k x[m, k] W[row0 + r, k]`` for the ``M = x.shape[0] <= 8`` rows of x.

    ``data``: the object's bytes (uint8 device array); ``x``: float32, C-contiguous,
    ``p.x_width`` columns, 16-byte aligned; ``y``: float32 device view whose rows are
    ``ldy`` apart (a column slice of a wider output is fine). ``rows_per_warp`` and
    ``k_split`` override the tuned defaults (only the combinations of ``ROWS_PER_WARP`` x
    ``K_SPLITS`` and ``TUNING`` are compiled).
    """
    m = x.shape[0]
    ks = k_split or default_k_split(rows, p.units)
    r = rows_per_warp or default_rows_per_warp(p.code, m, rows, ks)
    family, kernel = _GEMV_KERNELS[p.code]
    fn = function(family, f"{kernel}<{m}, {r}, {ks}>")
    per_block = GEMV_WARPS // ks * r
    fn(
        ((rows + per_block - 1) // per_block,),
        (GEMV_WARPS * 32,),
        (
            data,
            np.int64(p.off1),
            np.int64(p.off2),
            np.int32(p.stride),
            np.int32(p.rows_per_divisor),
            np.int32(row0),
            np.int32(rows),
            np.int32(p.units),
            x,
            np.int32(x.shape[1]),
            y,
            np.int32(ldy),
        ),
    )


def dequant_rows(data: Any, p: F.Planes, rows: Any, out: Any) -> None:
    """``out[i, :] = W[rows[i], :]`` as float32 (rows: int32 device array of absolute rows;
    out: C-contiguous float32 ``[len(rows), p.columns]``)."""
    n = int(rows.shape[0])
    if n == 0:
        return
    total = n * p.columns
    threads = 256
    grid = min((total + threads - 1) // threads, 65535 * 8)
    function("dequant", f"dequant_rows<{p.code}>")(
        (grid,),
        (threads,),
        (
            data,
            np.int64(p.off1),
            np.int64(p.off2),
            np.int32(p.stride),
            np.int32(p.rows_per_divisor),
            rows,
            np.int32(n),
            np.int32(p.columns),
            out,
        ),
    )
