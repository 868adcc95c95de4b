"""Launchers for the packed-weight kernels: small-M products and row dequantization.

The small-M products are the tensor-core kernel (``small_gemm``: ``kernels/gemm_small.cu``,
row_split q4/q5/q6/q8, NVFP4, bf16 and the K-quants) and the SIMT GEMV (``gemv``:
``kernels/gemv_*.cu``, every layout, 8 rows per launch; ``gguf_*`` blocks through
``gguf_blocks``); which one serves a product (or the tile kernel, ``tile_products``) is the
linear family's policy (``ops/linear``). Kernels are compiled lazily, one family (one ``.cu``
file) at a time, on first use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...arrays import array_module
from . import formats as F
from . import gguf_blocks, split_sums, tile_products
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

SMALL_FAMILY = "gemm_small"
#: the policy contract and the ggml K-quant policies, which the CPU tests also build
SMALL_HEADERS = ("gemm_small_policy.cuh", "gemm_small_gguf.cuh")
_GGUF_Q4_K, _GGUF_Q5_K, _GGUF_Q6_K = (F.GGUF_CODES[f"gguf_q{b}_k"] for b in (4, 5, 6))
#: the tensor-core layouts: kernel, weights per group step, and whether groups have a min
#: (the kernel then reads a sum of x per group beside the fragments); the first six also
#: have the grouped product (the MoE prefill)
_SMALL = {
    F.Q4: ("small_q4", 64, False),
    F.Q5: ("small_q5", 64, False),
    F.Q6: ("small_q6", 64, False),
    F.Q8: ("small_q8", 32, False),
    F.NVFP4: ("small_nvfp4", 64, False),
    F.BF16: ("small_bf16", 64, False),
    _GGUF_Q4_K: ("small_gguf_q4_k", 32, True),
    _GGUF_Q5_K: ("small_gguf_q5_k", 32, True),
    _GGUF_Q6_K: ("small_gguf_q6_k", 16, False),
}
_SMALL_KERNELS = {code: kernel for code, (kernel, _, _) in _SMALL.items()}
_GROUPED_KERNELS = {code: _SMALL_KERNELS[code] for code in list(_SMALL)[:6]}
#: weights per group step of each tensor-core layout
_SMALL_GROUP = {code: group for code, (_, group, _) in _SMALL.items()}
#: must match SMALL_WARPS in kernels/gemm_small.cu
SMALL_WARPS = 4
MAX_SMALL_ROWS = 64
#: (R, U) compiled for each count NT of 8-row activation tiles: R 16-row weight tiles per
#: warp, U groups per loop step; the first is the default. From two activation tiles on
#: (a speculative verification's 9..64 rows), two weight tiles per warp halve the
#: activation fragments loaded per weight byte: 1.2-1.5x on the 27B projections
#: (docs/performance.md, "Tiles for 9..64 rows")
SMALL_TILES = {
    1: [(2, 2), (2, 4), (1, 4), (4, 2), (4, 1), (1, 8)],
    2: [(2, 1), (1, 4), (2, 2), (4, 1)],
    4: [(2, 1), (1, 2), (2, 2), (1, 1)],
    8: [(2, 1), (1, 1)],
}
#: most K slices a product is split into, and the fewest groups a slice may get
MAX_SPLIT = 16
MIN_SPLIT_GROUPS = 2
SMALL_CONFIGS = [(nt, r, u) for nt, tiles in SMALL_TILES.items() for r, u in tiles]
#: activation tiles of 8 rows per group of the grouped product (MoE prefill: one expert's
#: pairs, 8 * tiles rows a group; only a group's tiles holding live rows are computed, so a
#: large group costs its pairs, and a weight decoded once serves them all), its 16-row
#: weight tiles per warp (4 measured slower: 0.60 against 0.54 ms on the 35B-A3B gate|up, at
#: 4 tiles), the k-groups it keeps in flight and the tiles it multiplies side by side; the
#: compiled (tiles, depth, chunk), the first the default. On the 35B-A3B at 2,048 rows (about
#: 64 pairs an expert), gate|up and down in ms: (12, 2, 4) 0.402 / 0.281, (12, 3, 4) 0.412 /
#: 0.295, (12, 3, 2) 0.408 / 0.290, (8, 3, 4) 0.458 / 0.351, (4, 3, 4) 0.501 / 0.405
GROUP_WEIGHT_TILES = 2
GROUP_CONFIGS = ((12, 2, 4), (12, 3, 4), (12, 3, 2), (8, 3, 4), (4, 3, 4))
GROUP_TILES = GROUP_CONFIGS[0][0]
register_family(
    SMALL_FAMILY,
    [f"{k}<{nt}, {r}, {u}>" for k in _SMALL_KERNELS.values() for nt, r, u in SMALL_CONFIGS]
    + [f"{k}_x" for k in _SMALL_KERNELS.values()]
    + [
        f"{k}_groups<{nt}, {GROUP_WEIGHT_TILES}, {d}, {c}>"
        for k in _GROUPED_KERNELS.values()
        for nt, d, c in GROUP_CONFIGS
    ]
    + [f"{k}_groups_x" for k in _GROUPED_KERNELS.values()],
    headers=SMALL_HEADERS,
)

__all__ = ["compile_all", "dequant_rows", "gemv", "small_gemm"]


def max_rows(p: F.Planes) -> int:
    """The most activation rows a small-M product takes for this object (more: dequantize +
    GEMM): ``MAX_SMALL_ROWS`` wherever the GEMV reads the layout, 0 where it cannot."""
    return MAX_SMALL_ROWS if p.gemv else 0


def has_tensor_cores(p: F.Planes) -> bool:
    """Whether the tensor-core small-M kernel reads this object (in its stored layout)."""
    return not p.tiled and _small_groups(p) > 0


def has_grouped_product(p: F.Planes) -> bool:
    """Whether the grouped tensor-core product (``small_gemm_groups``) reads this object."""
    return p.code in _GROUPED_KERNELS and has_tensor_cores(p)


def _small_groups(p: F.Planes) -> int:
    """Group steps per row the tensor-core kernel walks, 0 when it cannot read ``p``."""
    step = _SMALL_GROUP.get(p.code)
    if step is None or p.x_width % step:
        return 0
    return p.x_width // step


def small_gemm(
    data: Any,
    p: F.Planes,
    row0: int,
    rows: int,
    x: Any,
    y: Any,
    ldy: int,
    tiles: tuple[int, int] | None = None,
    split: int | None = None,
) -> None:
    """The tensor-core product for ``M = x.shape[0] <= 64`` (arguments as ``gemv``; the
    layout must have a kernel: ``has_tensor_cores(p)``). ``tiles`` (R, U: one of
    ``SMALL_TILES``) and ``split`` (K slices) override the defaults."""
    m = x.shape[0]
    nt = 1 << max(0, (m - 1).bit_length() - 3)  # 8-row activation tiles: 1, 2, 4 or 8
    groups = _small_groups(p)
    r, u = tiles or SMALL_TILES[nt][0]
    blocks = -(-rows // (SMALL_WARPS * 16 * r))
    kernel = _SMALL_KERNELS[p.code]
    fn = function(SMALL_FAMILY, f"{kernel}<{nt}, {r}, {u}>")
    partial, counters = split_sums.buffers()
    if split is None:  # K slices to fill the device in one wave (a second, partial wave
        # would double the time), each slice at least MIN_SPLIT_GROUPS loop steps long
        resident = split_sums.resident_blocks(fn, SMALL_WARPS * 32)
        split = min(MAX_SPLIT, groups // (MIN_SPLIT_GROUPS * u), resident // blocks)
        split = max(1, min(split, split_sums.PARTIAL_FLOATS // (m * rows)))
    if split > 1 and (split * m * rows > split_sums.PARTIAL_FLOATS or blocks > counters.size):
        raise ValueError(f"split {split}: partial sums for {m} x {rows} do not fit")
    xf = _x_fragments(p.code, x, groups, nt)
    fn(
        (blocks, split),
        (SMALL_WARPS * 32,),
        (
            data,
            *p.kernel_args(),
            np.int32(row0),
            np.int32(rows),
            np.int32(groups),
            xf,
            np.int32(m),
            y,
            np.int32(ldy),
            partial,
            counters,
        ),
    )


def small_gemm_groups(
    base: Any,
    row0: Any,
    group_expert: Any,
    p: F.Planes,
    rows: int,
    x: Any,
    y: Any,
    ldy: int,
    x_rows: Any = None,
    group_rows: Any = None,
    *,
    config: tuple[int, int, int] = GROUP_CONFIGS[0],
    gated: bool = False,
) -> None:
    """``y[g * M + m, r] = sum_k x[g * M + m, k] W_e[row0[e] + r, k]`` with ``e =
    group_expert[g]`` for every group g of ``M = 8 * config[0]`` rows (-1: the group is
    skipped) on the tensor cores, x rounded to bf16; ``base``/``row0``: each expert's object
    address and first row (int64 / int32 device arrays), all of planes ``p``
    (``has_tensor_cores(p)``); ``x``: float32, ``p.x_width`` columns, ``len(group_expert) *
    M`` rows, or with ``x_rows`` (int32 [len(group_expert) * M]) any rows, product row i
    reading row ``x_rows[i]`` of x (-1: zeros). ``group_rows`` (int32 [len(group_expert)]):
    group g's live rows, its first ones; only the 8-row tiles holding them are computed and
    written (default: all M). ``config``: one of ``GROUP_CONFIGS``, ``(tiles, depth, chunk)``:
    the 8-row tiles of a group, the k-groups in flight, the tiles multiplied side by side.
    ``gated``: the expert's rows ``rows .. 2 rows - 1`` are the up projection of gate rows
    ``0 .. rows - 1``, and ``y[., r] = silu(gate_r) * up_r`` (a gated MLP's hidden rows,
    without the gate|up product ever leaving the kernel)."""
    if config not in GROUP_CONFIGS:
        raise ValueError(f"grouped product: configuration {config} is not compiled")
    (nt, depth, chunk), r = config, GROUP_WEIGHT_TILES
    kernel, groups, count = _SMALL_KERNELS[p.code], _small_groups(p), int(group_expert.size)
    mmas = _SMALL_GROUP[p.code] // 16
    xp = array_module(x)
    # 8 bytes (a bf16 B fragment) per mma, per lane, per activation tile, per k-group
    xf = xp.empty(count * groups * nt * 32 * mmas * 2, dtype=xp.uint32)
    threads = groups * nt * 32
    live = np.uint64(0) if group_rows is None else group_rows  # a null pointer: all rows
    function(SMALL_FAMILY, f"{kernel}_groups_x")(
        (-(-threads // 256), count),
        (256,),
        (
            x,
            np.int32(x.shape[1]),
            np.uint64(0) if x_rows is None else x_rows,  # a null pointer: rows in order
            live,
            np.int32(groups),
            np.int32(nt),
            xf,
        ),
    )
    per_warp = 16 if gated else 16 * r  # gated: a warp's two tiles are one gate | up pair
    function(SMALL_FAMILY, f"{kernel}_groups<{nt}, {r}, {depth}, {chunk}>")(
        (-(-rows // (SMALL_WARPS * per_warp)), 1, count),
        (SMALL_WARPS * 32,),
        (
            base,
            row0,
            group_expert,
            live,
            *p.kernel_args(),
            np.int32(rows),
            np.int32(groups),
            xf,
            y,
            np.int32(ldy),
            np.int32(gated),
        ),
    )


def _x_fragments(code: int, x: Any, groups: int, nt: int) -> Any:
    """x [M, K] float32 in the kernel's fragment order: per group step, 8-row activation
    tile and lane, 16 bytes per mma (bf16 hi and lo halves), and for layouts with mins 16
    more (the group's sums of x)."""
    import cupy as cp

    kernel, group, mins = _SMALL[code]
    slots = group // 16 + int(mins)
    threads = groups * nt * 32
    out = cp.empty(threads * slots * 4, dtype=cp.uint32)
    function(SMALL_FAMILY, f"{kernel}_x")(
        (-(-threads // 256),),
        (256,),
        (x, np.int32(x.shape[1]), np.int32(x.shape[0]), np.int32(groups), np.int32(nt), out),
    )
    return out


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
