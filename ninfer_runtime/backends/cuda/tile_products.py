"""Launchers of ``kernels/tiles.cu``: products of up to 8 activation rows and row decoding
over tile-packed objects (``tiles.py``).

x enters a product in one of two precisions: split (``split_x``: hi + lo halves, ~16 bits of
x for bf16 operands and ~22 for fp16; the precision the GPU path is checked at against the
float32 reference) or production (x rounded once to bf16 or fp16: half the mma columns and
half the staged x).

Launch shape of a product: a (BX, S) grid of blocks of W warps, one row tile a warp (BX =
tiles / W), S slices of K. S gives about two (tile, slice) warps per resident one (every
slice at least ``MIN_SLICE`` groups), and at least what fits each block's share of x in
shared memory: few, long rows then still have enough warps streaming, and every warp does the
same work, so none is left streaming alone at the end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import formats as F
from . import split_sums
from .compile import function, register_family, sm_count
from .gguf_tables import iq2_xxs_tile_tables
from .tiles import IQ2_XXS, Q4_K, Q5_K, Q6_K, TILE_ROWS

FAMILY = "tiles"
#: warps a block, by activation rows: with more rows a block's staged x costs more, so more
#: warps share it (measured, q4 on the 27B shapes: at one row 4 warps 48% of the floor against
#: 47% for 8; at four rows 38-44% against 40-49%, at eight 25-31% against 30-36%)
WARPS = {m: 4 if m <= 2 else 8 for m in range(1, 9)}
#: formats whose blocks take 8 warps at every row count: a block fills shared tables first
#: (iq2_xxs [17408, 5120] at one row: 30.8 us against 33.5 for 4 warps, at two 31.4 against 37.8)
WIDE = frozenset({IQ2_XXS})
#: every compiled block size
BLOCK_WARPS = (4, 8)
#: most activation rows a launch takes (two 8-column blocks of hi|lo pairs, or one of rows)
MAX_ROWS = 8
#: most dynamic shared memory (staged x) a block takes
MAX_SHARED = 96 << 10
#: fewest groups a K slice gets (two loop steps)
MIN_SLICE = 8
#: shared memory of one multiprocessor (sm_90), for the residency estimate
SM_SHARED = 227 << 10

_KERNELS = {
    F.Q4: "tiles_q4",
    F.Q5: "tiles_q5",
    F.Q8: "tiles_q8",
    Q4_K: "tiles_q4k",
    Q5_K: "tiles_q5k",
    Q6_K: "tiles_q6k",
    IQ2_XXS: "tiles_iq2xxs",
}
#: weights per group and mmas per group of each tiled format
_GROUP = {F.Q4: 64, F.Q5: 64, F.Q8: 32, Q4_K: 64, Q5_K: 64, Q6_K: 64, IQ2_XXS: 64}
#: parts of a group with a sum of x of their own, for the offset its fragments carry (and
#: q4_k's and q5_k's mins): theirs are two sub-blocks, q6_k's four
_SUMS = {F.Q4: 1, Q4_K: 2, Q5_K: 2, Q6_K: 4}
register_family(
    FAMILY,
    [f"{k}<{nb}, {w}, true>" for k in _KERNELS.values() for nb in (1, 2) for w in BLOCK_WARPS]
    + [f"{k}<1, {w}, false>" for k in _KERNELS.values() for w in BLOCK_WARPS]
    + [f"{k}_rows<{b}>" for k in _KERNELS.values() for b in ("false", "true")],
    prelude=iq2_xxs_tile_tables,
)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def shape(
    p: F.Planes,
    row0: int,
    rows: int,
    m: int,
    blocks_per_sm: int,
    warps: int,
    split: int | None = None,
    static_shared: int = 0,
    split_x: bool = True,
) -> tuple[int, int, int]:
    """``(tiles, S, groups per slice)`` of a launch over rows ``row0 .. row0 + rows - 1`` for
    m activation rows, ``blocks_per_sm`` blocks fitting a multiprocessor by registers (and
    by shared memory, with ``static_shared`` bytes of tables a block and slices of at least
    ``MIN_SLICE`` groups): slices short enough that staged x does not lower that, and as many
    as give about two (tile, slice) warps per resident one (measured: 2-4% faster than one;
    ``split`` overrides that choice). ``split_x``: x staged as hi + lo halves."""
    tiles = (row0 + rows - 1) // TILE_ROWS - row0 // TILE_ROWS + 1
    groups, staged = p.stride, _staged(p, m, split_x)
    if static_shared:
        fits = SM_SHARED // (static_shared + 1024 + MIN_SLICE * staged)
        blocks_per_sm = max(1, min(blocks_per_sm, fits))
    room = min(MAX_SHARED, SM_SHARED // blocks_per_sm - 1024 - static_shared)
    longest = max(4, room // staged // 4 * 4)
    fewest = _ceil(groups, longest)
    if split is None:
        resident = sm_count() * blocks_per_sm * warps
        partials = split_sums.PARTIAL_FLOATS // (m * rows)
        split = min(2 * resident // tiles, groups // MIN_SLICE, partials)
    per = _ceil(_ceil(groups, max(1, fewest, split)), 4) * 4  # a multiple of 4
    return tiles, _ceil(groups, per), per


def _staged(p: F.Planes, m: int, split_x: bool = True) -> int:
    """Bytes of staged x a group takes: 8 bytes a (row, hi|lo or the rounded x, lane t, mma),
    and for q4 and the K-quants its sums of x (a row: 16 four-element parts and the sums of
    its parts)."""
    sums = _SUMS.get(p.code)
    halves = 2 if split_x else 1
    return 32 * halves * m * (_GROUP[p.code] // 16) + (4 * m * (16 + sums) if sums else 0)


def product(
    data: Any,
    p: F.Planes,
    row0: int,
    rows: int,
    x: Any,
    y: Any,
    ldy: int,
    split: int | None = None,
    warps: int | None = None,
    split_x: bool = True,
) -> None:
    """``y[m, r] = sum_k x[m, k] W[row0 + r, k]`` for ``M = x.shape[0] <= MAX_ROWS`` rows of
    x (float32, C-contiguous, ``p.x_width`` columns, zero padded); ``y``: float32 rows
    ``ldy`` apart. ``split``: K slices, ``warps``: warps a block (one of ``BLOCK_WARPS``;
    defaults: ``shape``'s choice and ``WARPS``); ``split_x``: x as hi + lo halves (False: x
    rounded once, the production precision)."""
    m = int(x.shape[0])
    if not 0 < m <= MAX_ROWS or x.shape[1] != p.x_width:
        raise ValueError(
            f"tile product: x {tuple(x.shape)}, expected 1..{MAX_ROWS} rows of {p.x_width}"
        )
    warps = warps or (8 if p.code in WIDE else WARPS[m])
    blocks_of_columns = 1 if m <= 4 or not split_x else 2
    name = f"{_KERNELS[p.code]}<{blocks_of_columns}, {warps}, {'true' if split_x else 'false'}>"
    fn = function(FAMILY, name, shared=MAX_SHARED)
    by_registers = split_sums.blocks_per_sm(fn, warps * 32)
    tables = split_sums.static_shared(fn)
    tiles, split, per = shape(p, row0, rows, m, by_registers, warps, split, tables, split_x)
    most = split_sums.PARTIAL_FLOATS // (split * m) // TILE_ROWS * TILE_ROWS
    if split > 1 and rows > most:  # (a head at 8 rows) the partial sums of a part at a time
        for a in range(0, rows, most):
            product(data, p, row0 + a, min(most, rows - a), x, y[:, a:], ldy, split, warps, split_x)
        return
    blocks = _ceil(tiles, warps)
    if blocks > split_sums.COUNTERS:
        raise ValueError(f"tile product: {rows} rows need {blocks} blocks, at most the counters'")
    shared = per * _staged(p, m, split_x)
    partial, counters = split_sums.buffers()
    fn(
        (blocks, split),
        (warps * 32,),
        (
            data,
            np.int64(p.off1),
            np.int64(p.off2),
            np.int32(p.stride),
            np.int32(row0 // TILE_ROWS),
            np.int32(tiles),
            np.int32(row0),
            np.int32(rows),
            np.int32(per),
            x,
            np.int32(x.shape[1]),
            np.int32(m),
            y,
            np.int32(ldy),
            partial,
            counters,
        ),
        shared_mem=shared,
    )


def decode_rows(data: Any, p: F.Planes, rows: Any, out: Any) -> None:
    """``out[i, :] = W[rows[i], :]`` (rows: int32 device array; out: ``[len(rows),
    p.columns]`` float32, or uint16 bf16 words rounded to nearest even)."""
    n = int(rows.shape[0])
    bf16 = out.dtype == np.uint16
    threads = n * _ceil(p.columns, _GROUP[p.code] // 4)  # one lane's run of a group each
    function(FAMILY, f"{_KERNELS[p.code]}_rows<{'true' if bf16 else 'false'}>")(
        (-(-threads // 256),),
        (256,),
        (
            data,
            np.int64(p.off1),
            np.int64(p.off2),
            np.int32(p.stride),
            rows,
            np.int32(n),
            np.int32(p.columns),
            out,
        ),
    )
