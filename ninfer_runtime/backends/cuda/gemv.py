"""The SIMT kernels of the stored layouts: the GEMV (``gemv``: ``kernels/gemv_*.cu``, every
layout, up to 8 activation rows a launch; ``gguf_*`` blocks through ``gguf_blocks``) with its
tuned launch shapes, and row dequantization (``dequant_rows``: ``kernels/dequant.cu``; tiled
objects through ``tile_products``). ``kernels.py``, the launchers' front, re-exports both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import formats as F
from . import gguf_blocks, tile_products
from .compile import function, register_family

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
    """R for one launch, by ``benchmarks/gpu_bench.py --tune simt`` on the H200 at one
    activation row (last 2026-12-02, q4/q5/q6/q8 on five shapes from [2048, 4096] to
    [17408, 5120]; fp8, bf16 and nvfp4 on 2026-11-29): the 4- to 6-bit row_split layouts
    keep more loads in flight with 8 rows a warp on many or split rows; q8 takes 8 when K is
    split (73% of the floor on [17408, 5120] against 64% at 4 unsplit), else 4; fp8 and bf16
    do best with 4, nvfp4 with 2. With several activation rows R = 4 was best for every
    layout."""
    if m > 1:
        return ROWS_PER_WARP[m]
    if code == F.NVFP4:
        return 2
    if code == F.Q8:
        return 8 if k_split > 1 else 4
    if code in (F.FP8, F.BF16):
        return 4
    return 8 if rows >= 16384 or k_split > 1 else 4


def default_k_split(code: int, rows: int, units: int) -> int:
    """Split K over the block's warps when rows are few and long (too few warps otherwise),
    and for q4 and q8 on long rows whatever their number: on [17408, 5120] at one row,
    measured 2026-12-02, q4 46% of the floor split against 42% (its grid of 544 blocks is 1.03
    waves unsplit), q8 73% against 64%; q5 and q6 are faster unsplit there (50% against 45%)."""
    if units < 128:
        return 1
    return GEMV_WARPS if rows < 8192 or code in (F.Q4, F.Q8) else 1


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
#: dequantization kernel by output dtype: float32 values, or bf16 words
_DEQUANT_KERNELS = {np.dtype(np.float32): "dequant_rows", np.dtype(np.uint16): "dequant_rows_bf16"}
#: bf16 words eight a thread (rows of a multiple of 8 columns)
_DEQUANT_BF16_X8 = "dequant_rows_bf16x8"
register_family(
    "dequant",
    [
        f"{k}<{code}>"
        for k in (*_DEQUANT_KERNELS.values(), _DEQUANT_BF16_X8)
        for code in sorted(_GEMV_KERNELS)
    ],
)


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
    if p.tiled:
        raise ValueError("gemv: a tile-packed object (tile_products reads it)")
    if F.is_gguf(p.code):
        gguf_blocks.gemv(data, p, row0, rows, x, y, ldy)
        return
    ks = k_split or default_k_split(p.code, rows, p.units)
    r = rows_per_warp or default_rows_per_warp(p.code, m, rows, ks)
    family, kernel = _GEMV_KERNELS[p.code]
    fn = function(family, f"{kernel}<{m}, {r}, {ks}>")
    per_block = GEMV_WARPS // ks * r
    fn(
        ((rows + per_block - 1) // per_block,),
        (GEMV_WARPS * 32,),
        (
            data,
            *p.kernel_args(),
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
    """``out[i, :] = W[rows[i], :]`` (rows: int32 device array of absolute rows; out:
    C-contiguous ``[len(rows), p.columns]``, float32, or uint16 for bf16 words: the float32
    values rounded to nearest even)."""
    n = int(rows.shape[0])
    if n == 0:
        return
    kernel = _DEQUANT_KERNELS.get(np.dtype(out.dtype))
    if kernel is None or tuple(out.shape) != (n, p.columns) or not out.flags.c_contiguous:
        raise ValueError(
            f"out: {out.dtype} {out.shape}, expected float32 or uint16 {(n, p.columns)}"
        )
    if p.tiled:
        tile_products.decode_rows(data, p, rows, out)
        return
    if F.is_gguf(p.code):
        gguf_blocks.dequant_rows(data, p, rows, out)
        return
    total = n * p.columns
    if out.dtype == np.uint16 and p.columns % 8 == 0 and total // 8 < 2**32:
        kernel, total = _DEQUANT_BF16_X8, total // 8
    threads = 256
    grid = min((total + threads - 1) // threads, 65535 * 8)
    function("dequant", f"{kernel}<{p.code}>")(
        (grid,),
        (threads,),
        (
            data,
            *p.kernel_args(),
            rows,
            np.int32(n),
            np.int32(p.columns),
            out,
        ),
    )
