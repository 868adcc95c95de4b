"""Launchers for the packed-weight kernels: small-M products and row dequantization.

The small-M products are the tensor-core kernel (``small_gemm``: ``kernels/gemm_small.cu``,
row_split q4/q5/q6/q8, NVFP4, bf16 and the K-quants) and the SIMT GEMV (``gemv``:
``kernels/gemv_*.cu``, every layout, 8 rows per launch; ``gguf_*`` blocks through
``gguf_blocks``); which one serves a product (or the tile kernel, ``tile_products``) is the
linear family's policy (``ops/linear``). Kernels are compiled lazily, one family (one ``.cu``
file) at a time, on first use.

The SIMT GEMV and the row dequantization are in ``gemv.py`` (re-exported here).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...arrays import array_module
from . import formats as F
from . import split_sums
from .compile import compile_all, function, register_family

# The GEMV, its launch shapes and the row dequantization are re-exported: the linear family,
# the MoE experts, the backend, the benchmarks and the tests name them through this module
from .gemv import (  # noqa: F401
    GEMV_CONFIGS,
    GEMV_WARPS,
    K_SPLITS,
    MAX_GEMV_ROWS,
    ROWS_PER_WARP,
    TUNING,
    default_k_split,
    default_rows_per_warp,
    dequant_rows,
    gemv,
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
    [
        f"{k}<{nt}, {r}, {u}, {split_x}>"
        for k in _SMALL_KERNELS.values()
        for nt, r, u in SMALL_CONFIGS
        for split_x in ("true", "false")
    ]
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
    split_x: bool = True,
) -> None:
    """The tensor-core product for ``M = x.shape[0] <= 64`` (arguments as ``gemv``; the
    layout must have a kernel: ``has_tensor_cores(p)``). ``tiles`` (R, U: one of
    ``SMALL_TILES``) and ``split`` (K slices) override the defaults; ``split_x``: x as hi + lo
    bf16 halves (~16 bits; False: x rounded once to bf16, one mma a tile instead of two)."""
    m = x.shape[0]
    nt = 1 << max(0, (m - 1).bit_length() - 3)  # 8-row activation tiles: 1, 2, 4 or 8
    groups = _small_groups(p)
    r, u = tiles or SMALL_TILES[nt][0]
    blocks = -(-rows // (SMALL_WARPS * 16 * r))
    kernel = _SMALL_KERNELS[p.code]
    fn = function(SMALL_FAMILY, f"{kernel}<{nt}, {r}, {u}, {'true' if split_x else 'false'}>")
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
