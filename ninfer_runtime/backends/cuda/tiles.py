"""Tile packing: the one-time reordering of row_split q4/q5/q8 objects that the decode products
(``kernels/tiles.cu``) read with one 16-byte load a lane (the loader packs the objects of
``PACKED_AT_LOAD`` formats from ``PACK_FROM_WEIGHTS`` weights on).

The same bits per weight, in another order (never a dequantized copy). A tile is 16 rows x
one group (64 weights for q4/q5, 32 for q8); tiles follow each other group by group along a
row tile, row tile by row tile, so a warp streams one contiguous run of memory. Within a tile,
lane ``l = 4 g + t`` of a warp holds 16 bytes: everything its ``mma.m16n8k16`` A fragments
need for rows ``g`` and ``g + 8``. Lane ``t`` takes the group's weights ``k = 16 t + 4 j + i``
(q8: ``8 t + 4 j + i``) for mma ``j`` and fragment slots ``i = 0..3`` (the product may visit
k in any order as long as x follows it; the kernel stages x the same way).

Planes of a tiled object, one buffer: codes (512 bytes a tile), then for q5 the high bits
(4 bytes a lane and group: 128 bytes a tile), then the scales (binary16; per row tile and
four groups, lane group ``g`` reads the 16 bytes holding rows ``g`` and ``g + 8`` of the four
groups). Rows are padded to whole row tiles and groups to a multiple of four with codes of
value zero and scale 0. Codes are stored offset binary (``c = q + 2^(b-1)``) so the kernel
need not flip sign bits.

Word layouts (what ``tiles.cu`` decodes):
* q4/q5: word ``j`` of a lane holds nibbles ``n = 0..7``; nibble ``i < 4`` is the first
  element of fragment pair ``i``, nibble ``4 + i`` its second. Pair 0: row g, slots 0-1;
  pair 1: row g + 8, slots 0-1; pair 2: row g, slots 2-3; pair 3: row g + 8, slots 2-3 (the
  order of ``mma.m16n8k16``'s A registers), so pair i is ``(word >> 4 i) & 0x000F000F``.
* q5 high bits: bit ``P = 4 j + i`` of the lane's word is the fifth bit of pair ``P``'s first
  element, bit ``16 + P`` that of its second.
* q8: word ``2 j + h`` holds bytes ``(row g, slot 2h), (row g + 8, slot 2h), (row g, slot
  2h + 1), (row g + 8, slot 2h + 1)``.

Everything here is written on array operations (numpy or CuPy alike), so the CPU tests check
that packing and unpacking give the stored bytes back, and the loader runs the same code on
the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from ninfer_format.codecs.row_split import FORMATS, row_split_geometry

from . import formats as F

TILE_ROWS = 16
LANES = 32
#: bytes of codes a tile holds (every tiled format)
TILE_CODE_BYTES = 512
#: row tiles packed per pass (bounds the temporaries of a large object)
CHUNK_TILES = 256

_NAMES = {F.Q4: "q4_g64_fp16", F.Q5: "q5_g64_fp16", F.Q8: "q8_g32_fp16"}
#: the row_split codes the tile kernels read
TILED_CODES = frozenset(_NAMES)
#: the codes the loader tile packs, and from how many weights an object: where the tile
#: kernel is also the faster at one row. Measured on the H200 (benchmarks/gpu_bench.py,
#: 2026-12-04): q4 [34816, 5120] 56% of the floor against the GEMV's 53% at one row, 37%
#: against 30% at eight; [13312, 5120] 45% / 44% and 29% / 25%; but [4096, 5120] 28% against
#: 35% at one row (a block's staging of x and the K-split sum cost a few microseconds a
#: launch). q5 (44% against 49-51%) and q8 (65% against 68-74%) lose at one row even on the
#: 27B MLP shapes, so they keep the stored layout until their tile decode costs fewer
#: instructions.
PACKED_AT_LOAD = frozenset({F.Q4})
PACK_FROM_WEIGHTS = 50_000_000


@dataclass(frozen=True)
class TileGeometry:
    """Where the planes of a tiled ``[rows, columns]`` object lie."""

    code: int
    rows: int
    columns: int
    group: int  # weights per group
    groups: int  # groups per row, padded to a multiple of 4
    row_tiles: int
    high_offset: int
    scale_offset: int
    size: int

    @property
    def x_width(self) -> int:
        """Columns of x the product reads (zero padded past the object's)."""
        return self.groups * self.group


def tile_geometry(code: int, rows: int, columns: int) -> TileGeometry:
    fmt = FORMATS[_NAMES[code]]
    geo = row_split_geometry(fmt.name, (rows, columns))
    groups = -(-geo.groups_per_row // 4) * 4
    row_tiles = -(-rows // TILE_ROWS)
    codes = row_tiles * groups * TILE_CODE_BYTES
    high = row_tiles * groups * LANES * 4 if code == F.Q5 else 0
    scales = row_tiles * groups * TILE_ROWS * 2
    return TileGeometry(
        code, rows, columns, fmt.group, groups, row_tiles, codes, codes + high,
        codes + high + scales,
    )  # fmt: skip


def tiled_planes(code: int, rows: int, columns: int) -> F.Planes:
    """The kernel arguments of a tiled object: off1 the high bits, off2 the scales, stride
    the (padded) groups per row."""
    g = tile_geometry(code, rows, columns)
    return F.Planes(
        code, rows, columns, off1=g.high_offset, off2=g.scale_offset, stride=g.groups,
        x_width=g.x_width, units=g.x_width // 16, tiled=True,
    )  # fmt: skip


# ---------------------------------------------------------------- the orders, as tables
def _code_order(code: int) -> np.ndarray:
    """For each code field of a tile in stored order (lane, word, field), the weight it
    holds as ``row_in_tile * group + k``."""
    lane = np.arange(LANES)[:, None, None]
    g, t = lane // 4, lane % 4
    if code == F.Q8:
        w = np.arange(4)[None, :, None]
        b = np.arange(4)[None, None, :]
        j, h = w // 2, w % 2
        row = g + 8 * (b % 2)
        k = 8 * t + 4 * j + 2 * h + b // 2
        return (row * 32 + k).reshape(-1)
    j = np.arange(4)[None, :, None]
    n = np.arange(8)[None, None, :]
    pair, second = n % 4, n // 4
    row = g + 8 * (pair % 2)
    k = 16 * t + 4 * j + 2 * (pair // 2) + second
    return (row * 64 + k).reshape(-1)


def _high_order() -> np.ndarray:
    """For each high bit of a q5 tile (lane, bit), the index into ``_code_order``'s fields of
    the weight it belongs to: bit P < 16 is pair P's first element, bit 16 + P its second."""
    lane = np.arange(LANES)[:, None]
    bit = np.arange(32)[None, :]
    pair = bit % 16
    j, i, second = pair // 4, pair % 4, bit // 16
    return (lane * 32 + j * 8 + i + 4 * second).reshape(-1)


_CODE_ORDER = {code: _code_order(code) for code in TILED_CODES}
_HIGH_ORDER = _high_order()
_CODE_INVERSE = {code: np.argsort(order) for code, order in _CODE_ORDER.items()}


# ------------------------------------------------------------------------ pack / unpack
def _stored_rows(
    xp: ModuleType, raw: Any, code: int, shape: tuple[int, int], r0: int, r1: int
) -> tuple[Any, Any]:
    """Rows r0 .. r1 - 1 of a stored object: codes as offset-binary values [n, gpr, group]
    and scale words [n, gpr]."""
    geo = row_split_geometry(_NAMES[code], shape)
    gpr, n = geo.groups_per_row, r1 - r0
    base = raw[r0 * gpr * 32 : r1 * gpr * 32].reshape(n, gpr, 32)
    scales = raw[geo.scale_offset + r0 * gpr * 2 : geo.scale_offset + r1 * gpr * 2]
    scales = scales.view(xp.uint16).reshape(n, gpr)
    if code == F.Q8:
        return base ^ np.uint8(0x80), scales
    low = xp.stack([base & 15, base >> 4], axis=-1).reshape(n, gpr, 64)
    if code == F.Q4:
        return low ^ np.uint8(8), scales
    high = raw[geo.high_offset + r0 * gpr * 8 : geo.high_offset + r1 * gpr * 8]
    bits = (high.reshape(n, gpr, 8)[..., None] >> xp.arange(8, dtype=xp.uint8)) & 1
    return low | ((bits.reshape(n, gpr, 64) ^ 1) << 4), scales


def pack_tiles(xp: ModuleType, raw: Any, code: int, rows: int, columns: int) -> Any:
    """The tiled bytes (uint8 [size]) of a stored row_split object ``raw`` (uint8 array of
    the module ``xp``: numpy or CuPy)."""
    geo = tile_geometry(code, rows, columns)
    gpr = row_split_geometry(_NAMES[code], (rows, columns)).groups_per_row
    out = xp.zeros(geo.size, dtype=xp.uint8)
    codes_out = out[: geo.high_offset].reshape(geo.row_tiles, geo.groups, TILE_CODE_BYTES)
    scales_out = out[geo.scale_offset :].view(xp.uint16)
    scales_out = scales_out.reshape(geo.row_tiles, geo.groups // 4, 8, 4, 2)
    zero = {F.Q4: 8, F.Q5: 16, F.Q8: 128}[code]
    order = xp.asarray(_CODE_ORDER[code])
    for t0 in range(0, geo.row_tiles, CHUNK_TILES):
        t1 = min(geo.row_tiles, t0 + CHUNK_TILES)
        r0, r1 = t0 * TILE_ROWS, min(rows, t1 * TILE_ROWS)
        values, scales = _stored_rows(xp, raw, code, (rows, columns), r0, r1)
        full = xp.full(((t1 - t0) * TILE_ROWS, geo.groups, geo.group), zero, dtype=xp.uint8)
        full[: r1 - r0, :gpr] = values
        tiles = full.reshape(t1 - t0, TILE_ROWS, geo.groups, geo.group).transpose(0, 2, 1, 3)
        fields = tiles.reshape(t1 - t0, geo.groups, -1)[..., order]
        low = fields & 15 if code != F.Q8 else fields
        codes_out[t0:t1] = _pack_fields(xp, low, 4 if code != F.Q8 else 8)
        if code == F.Q5:
            high = (fields >> 4)[..., xp.asarray(_HIGH_ORDER)]
            high_out = out[geo.high_offset : geo.scale_offset].reshape(
                geo.row_tiles, geo.groups // 4, 16 * LANES
            )
            words = _pack_fields(xp, high, 1).reshape(t1 - t0, geo.groups // 4, 4, LANES, 4)
            # per lane, the four groups' words side by side (one 16-byte load)
            high_out[t0:t1] = words.transpose(0, 1, 3, 2, 4).reshape(t1 - t0, geo.groups // 4, -1)
        s = xp.zeros(((t1 - t0) * TILE_ROWS, geo.groups), dtype=xp.uint16)
        s[: r1 - r0, :gpr] = scales
        s = s.reshape(t1 - t0, 2, 8, geo.groups // 4, 4)
        scales_out[t0:t1] = s.transpose(0, 3, 2, 4, 1)
    return out


def unpack_tiles(xp: ModuleType, tiled: Any, code: int, rows: int, columns: int) -> Any:
    """The stored row_split bytes back from ``pack_tiles``'s (the round trip the tests check;
    padding of the stored object comes back as the codec writes it)."""
    geo = tile_geometry(code, rows, columns)
    stored = row_split_geometry(_NAMES[code], (rows, columns))
    gpr = stored.groups_per_row
    out = xp.zeros(stored.size, dtype=xp.uint8)
    n_fields = TILE_CODE_BYTES * 8 // (4 if code != F.Q8 else 8)
    words = tiled[: geo.high_offset].view(xp.uint32).reshape(geo.row_tiles, geo.groups, -1)
    fields = _unpack_fields(xp, words, 4 if code != F.Q8 else 8, n_fields)
    if code == F.Q5:
        high = tiled[geo.high_offset : geo.scale_offset].view(xp.uint32)
        high = high.reshape(geo.row_tiles, geo.groups // 4, LANES, 4).transpose(0, 1, 3, 2)
        bits = _unpack_fields(xp, high.reshape(geo.row_tiles, geo.groups, LANES), 1, 32 * LANES)
        inverse_high = np.argsort(_HIGH_ORDER)
        fields = fields | (bits[..., xp.asarray(inverse_high)] << 4)
    values = fields[..., xp.asarray(_CODE_INVERSE[code])]
    values = values.reshape(geo.row_tiles, geo.groups, TILE_ROWS, geo.group).transpose(0, 2, 1, 3)
    values = values.reshape(geo.row_tiles * TILE_ROWS, geo.groups, geo.group)[:rows, :gpr]
    if code == F.Q8:
        base = values ^ np.uint8(0x80)
    else:
        low = values & 15
        if code == F.Q4:
            low = low ^ np.uint8(8)
        base = (low[..., 0::2] | (low[..., 1::2] << 4)).astype(xp.uint8)
        if code == F.Q5:
            h = ((values >> 4) ^ 1).reshape(rows, gpr, 8, 8)
            packed = (h << xp.arange(8, dtype=xp.uint8)).sum(axis=-1).astype(xp.uint8)
            out[stored.high_offset : stored.high_offset + rows * gpr * 8] = packed.reshape(-1)
    out[: rows * gpr * 32] = base.reshape(-1)
    s = tiled[geo.scale_offset :].view(xp.uint16)
    s = s.reshape(geo.row_tiles, geo.groups // 4, 8, 4, 2).transpose(0, 4, 2, 1, 3)
    s = s.reshape(geo.row_tiles * TILE_ROWS, geo.groups)[:rows, :gpr]
    out[stored.scale_offset : stored.scale_offset + rows * gpr * 2] = s.reshape(-1).view(xp.uint8)
    return out


def _pack_fields(xp: ModuleType, fields: Any, bits: int) -> Any:
    """Consecutive ``bits``-wide fields (last axis) into little-endian uint32 words, as bytes."""
    per = 32 // bits
    f = fields.reshape(*fields.shape[:-1], -1, per).astype(xp.uint32)
    shifts = xp.arange(per, dtype=xp.uint32) * np.uint32(bits)
    words = (f << shifts).sum(axis=-1, dtype=xp.uint32)
    return xp.ascontiguousarray(words).view(xp.uint8).reshape(*fields.shape[:-1], -1)


def _unpack_fields(xp: ModuleType, words: Any, bits: int, count: int) -> Any:
    per = 32 // bits
    shifts = xp.arange(per, dtype=xp.uint32) * np.uint32(bits)
    f = (words[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    return f.reshape(*words.shape[:-1], count).astype(xp.uint8)
