"""Tile packing: the one-time reordering of row_split q4/q5/q8 and GGUF q4_k/q5_k/q6_k/iq2_xxs
objects that the decode products (``kernels/tiles.cu``) read with one 16-byte load a lane (the
loader packs them from ``PACK_FROM_WEIGHTS`` weights on, GGUF's whatever their size).

The same bits per weight, in another order (never a dequantized copy). A tile is 16 rows x
one group (64 weights for q4/q5, 32 for q8); tiles follow each other group by group along a
row tile, row tile by row tile, so a warp streams one contiguous run of memory. Within a tile,
lane ``l = 4 g + t`` of a warp holds 16 bytes: everything its ``mma.m16n8k16`` A fragments
need for rows ``g`` and ``g + 8``. Lane ``t`` takes the group's weights ``k = 16 t + 4 j + i``
(q8: ``8 t + 4 j + i``) for mma ``j`` and fragment slots ``i = 0..3`` (the product may visit
k in any order as long as x follows it; the kernel stages x the same way).

Planes of a tiled object, one buffer: codes (512 bytes a tile), then for q5 a fifth word a
lane (4 bytes a lane and group: 128 bytes a tile), then the scales (binary16; per row tile and
four groups, lane group ``g`` reads the 16 bytes holding rows ``g`` and ``g + 8`` of the four
groups). Rows are padded to whole row tiles and groups to a multiple of four with codes of
value zero and scale 0. Codes are stored offset binary (``c = q + 2^(b-1)``) so the kernel
need not flip sign bits.

Word layouts (what ``tiles.cu`` decodes):
* q4/q5: word ``j`` of a lane holds nibbles ``n = 0..7``; nibble ``i < 4`` is the first
  element of fragment pair ``i``, nibble ``4 + i`` its second. Pair 0: row g, slots 0-1;
  pair 1: row g + 8, slots 0-1; pair 2: row g, slots 2-3; pair 3: row g + 8, slots 2-3 (the
  order of ``mma.m16n8k16``'s A registers), so pair i is ``(word >> 4 i) & 0x000F000F``.
* q5 (read on fp16 fragments, whose 10 mantissa bits hold a 5-bit code at bits 0-4 or 5-9 of
  a half): the lane's five words (four in the code plane, the fifth in the q5 plane) hold
  pair ``P = 4 j + i`` of mma j (the pairs of q4's word j) as whole 5-bit codes: for P < 15
  word ``P // 3``, field ``P % 3`` (bits ``5 f .. 5 f + 4`` the first element, ``16 + 5 f ..``
  the second); pair 15's codes are spread over bits 15 (first) and 31 (second) of the five
  words, code bit b in word b.
* q8: word ``2 j + h`` holds bytes ``(row g, slot 2h), (row g + 8, slot 2h), (row g, slot
  2h + 1), (row g + 8, slot 2h + 1)``.
* GGUF q4_k (ggml's 256-weight blocks: d, dmin, twelve bytes of 6-bit sub-block scales and
  mins, 128 bytes of codes): a group is 64 weights, two 32-weight sub-blocks, so a block is
  four groups, one step of the product. Words as q4's, the codes unsigned as stored, but mma
  ``j`` takes sub-block ``j // 2`` (``k = 32 (j // 2) + 8 t + 4 (j % 2) + i``) so that each
  sub-block's scale applies to its own two mmas. In place of the scale plane, each block's
  16-byte head (d, dmin, the twelve scale bytes) per row: lane group ``g`` reads rows ``g``
  and ``g + 8`` of a row tile's block as two 16-byte loads.
* GGUF q5_k (q4_k's blocks with a fifth bit a code, 176 bytes): as q4_k, and the fifth bits
  in a plane of one word a lane and group (four groups a 16-byte load): pair ``i`` of mma
  ``j`` at bit ``4 j + i`` (first element) and ``16 + 4 j + i`` (second).
* GGUF q6_k (blocks of 256: low nibbles, high 2-bit codes, sixteen int8 scales of 16 weights,
  d): codes ``c = q + 32``, their low nibbles in q4's words, mma ``j`` on sub-block ``j`` of
  the group (``k = 16 j + 4 t + i``); the high bits in a second plane, two words a lane and
  group (a lane's words of four groups in one run of 32 bytes): word ``j // 2`` holds pair
  ``i`` of mma ``j`` at field ``f = 4 (j % 2) + i``, bits ``2 f`` (first element) and
  ``16 + 2 f`` (second). The scale plane holds a 288-byte record a row tile and block:
  for each lane group ``g`` the int8 scales of rows ``g`` and ``g + 8``, then the 16 rows' d.
* GGUF iq2_xxs (blocks of 256: d, then for each 32-weight sub-block four grid indices of 8
  weights, four 7-bit sign indices and a 4-bit scale): no code plane; as q4_k, mma ``j`` on
  sub-block ``j // 2`` of the group, so lane ``t`` holds grid row ``t`` of each sub-block for
  rows ``g`` and ``g + 8``. Its two words a lane and group (in q6_k's high-plane order): the
  four grid indices (byte ``2 h + rr``: sub-block h, row ``g + 8 rr``) and the four sign
  indices (bits ``7 (2 h + rr)``; the top four bits unused: 6% more bytes than the blocks). A
  96-byte record a row tile and block holds for each lane group the eight 4-bit scales of rows
  ``g`` and ``g + 8`` (a word each), then the rows' d.

Everything here is written on array operations (numpy or CuPy alike), so the CPU tests check
that packing and unpacking give the stored bytes back, and the loader runs the same code on
the device.

Here: ``pack_tiles`` and ``unpack_tiles``, and the row_split codes' rows; the constants and
geometry are in ``tile_layout``, the orders as tables and the bit-field packing in
``tile_orders``, the GGUF blocks' packing in ``tile_gguf`` (the public names re-exported here).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from ninfer_format.codecs.row_split import row_split_geometry

from . import formats as F
from .tile_gguf import (
    _fifth,
    _heads,
    _pack_iq2_xxs,
    _pack_q6_k,
    _q4_k_rows,
    _q6_k_rows,
    _tile_rows,
    _unpack_iq2_xxs,
    _unpack_q6_k,
)

# The constants and the geometry are re-exported: the tile products, the loader, the
# benchmarks and the tests name them through this module
from .tile_layout import (  # noqa: F401
    _NAMES,
    _Q4_K_HEAD,
    CHUNK_TILES,
    IQ2_XXS,
    LANES,
    Q4_K,
    Q5_K,
    Q6_K,
    TILE_CODE_BYTES,
    TILE_ROWS,
    TILED_CODES,
    TileGeometry,
    tile_geometry,
    tiled_planes,
)
from .tile_orders import (
    _CODE_INVERSE,
    _CODE_ORDER,
    _Q5_BITS,
    _Q5_INVERSE,
    _Q5_K_FIFTH,
    _pack_fields,
    _unpack_fields,
)

#: from how many weights the loader tile packs an object: where the tile kernel is also the
#: faster at one row. Measured on the H200 (benchmarks/gpu_bench.py,
#: 2026-12-04, % of the copy floor, tiles against the stored layout's best kernel, M = 1 / 8):
#: q4 [34816, 5120] 56 / 37 against 53 / 30; q5 [17408, 5120] 51 / 33 against 51 / 26; q8
#: [17408, 5120] 77 / 56 against 74 / 40; GGUF q4_k [17408, 5120] 40 / 25 against 24 / 12,
#: q5_k 40 / 27 against 27 / 4, iq2_xxs 19 / 14 against 9 / 1 (q6_k: see docs/performance.md,
#: GGUF-block artifacts).
#: Below about 50 M weights a block's staging of x and
#: the K-split sum (a few microseconds a launch) lose at one row: q4 [4096, 5120] 28 against
#: 35, q8 [12288, 2048] 51 against 56, q5 [2048, 4096] 19 against 27.
PACK_FROM_WEIGHTS = 50_000_000
#: the codes packed whatever their size: against the GGUF GEMV their tile kernels win at every
#: shape measured (H200, 2026-12-04, % of the floor at M = 1 / 8): q4_k [6144, 5120] 29 / 19
#: against 21 / 11, [1024, 5120] 10 / 7 against 6 / 3; q5_k 30 / 21 against 23 / 12, 11 / 8
#: against 7 / 4; q6_k 39 / 25 against 21 / 12, 14 / 9 against 7 / 4; iq2_xxs 14 / 9 against
#: 8 / 1, 4 / 3 against 3 / 1
PACKED_AT_ANY_SIZE = frozenset({Q4_K, Q5_K, Q6_K, IQ2_XXS})


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
    """The tiled bytes (uint8 [size]) of a stored row_split or GGUF object ``raw`` (uint8
    array of the module ``xp``: numpy or CuPy)."""
    geo = tile_geometry(code, rows, columns)
    if code == IQ2_XXS:
        return _pack_iq2_xxs(xp, raw, geo)
    out = xp.zeros(geo.size, dtype=xp.uint8)
    codes_out = out[: geo.high_offset].reshape(geo.row_tiles, geo.groups, TILE_CODE_BYTES)
    order = xp.asarray(_CODE_ORDER[code])
    zero = {F.Q4: 8, F.Q5: 16, F.Q8: 128, Q4_K: 0, Q5_K: 0, Q6_K: 32}[code]  # (the value 0)
    for t0 in range(0, geo.row_tiles, CHUNK_TILES):
        t1 = min(geo.row_tiles, t0 + CHUNK_TILES)
        r0, r1 = t0 * TILE_ROWS, min(rows, t1 * TILE_ROWS)
        if code in (Q4_K, Q5_K):
            values, heads = _q4_k_rows(xp, raw, code, columns, r0, r1)
        elif code == Q6_K:
            values, heads = _q6_k_rows(xp, raw, columns, r0, r1)
        else:
            values, scales = _stored_rows(xp, raw, code, (rows, columns), r0, r1)
        full = xp.full(((t1 - t0) * TILE_ROWS, geo.groups, geo.group), zero, dtype=xp.uint8)
        full[: r1 - r0, : values.shape[1]] = values
        tiles = full.reshape(t1 - t0, TILE_ROWS, geo.groups, geo.group).transpose(0, 2, 1, 3)
        fields = tiles.reshape(t1 - t0, geo.groups, -1)[..., order]
        if code == F.Q5:
            _pack_q5(xp, fields, out, geo, t0)
        elif code == Q6_K:
            codes_out[t0:t1] = _pack_fields(xp, fields & np.uint8(15), 4)
            _pack_q6_k(xp, fields, heads, out, geo, t0)
        elif code == Q5_K:
            codes_out[t0:t1] = _pack_fields(xp, fields & np.uint8(15), 4)
            bits = (fields >> 4).reshape(t1 - t0, geo.groups, LANES, 32)
            words = _pack_fields(xp, bits[..., xp.asarray(_Q5_K_FIFTH)], 1).view(xp.uint32)
            words = words.reshape(t1 - t0, geo.groups // 4, 4, LANES).transpose(0, 1, 3, 2)
            _fifth(out, geo)[t0:t1] = words
        else:
            codes_out[t0:t1] = _pack_fields(xp, fields, 8 if code == F.Q8 else 4)
        if code in (Q4_K, Q5_K):
            _heads(out, geo)[t0:t1] = _tile_rows(xp, heads, t1 - t0)
        elif code != Q6_K:
            scales_out = out[geo.scale_offset :].view(xp.uint16)
            scales_out = scales_out.reshape(geo.row_tiles, geo.groups // 4, 8, 4, 2)
            s = xp.zeros(((t1 - t0) * TILE_ROWS, geo.groups), dtype=xp.uint16)
            s[: r1 - r0, : scales.shape[1]] = scales
            s = s.reshape(t1 - t0, 2, 8, geo.groups // 4, 4)
            scales_out[t0:t1] = s.transpose(0, 3, 2, 4, 1)
    return out


def unpack_tiles(xp: ModuleType, tiled: Any, code: int, rows: int, columns: int) -> Any:
    """The stored bytes back from ``pack_tiles``'s (the round trip the tests check; padding of
    the stored object comes back as the codec writes it)."""
    geo = tile_geometry(code, rows, columns)
    if code == IQ2_XXS:
        return _unpack_iq2_xxs(xp, tiled, geo)
    words = tiled[: geo.high_offset].view(xp.uint32).reshape(geo.row_tiles, geo.groups, -1)
    if code == F.Q5:
        fields = _unpack_q5(xp, tiled, words, geo)
    else:
        bits = 8 if code == F.Q8 else 4
        fields = _unpack_fields(xp, words, bits, TILE_CODE_BYTES * 8 // bits)
    if code == Q6_K:
        fields, scales = _unpack_q6_k(xp, tiled, fields, geo)
    if code == Q5_K:
        fifth = _fifth(tiled, geo).transpose(0, 1, 3, 2)
        fifth = fifth.reshape(geo.row_tiles, geo.groups, LANES, 1)
        bits = _unpack_fields(xp, fifth, 1, 32)[..., xp.asarray(np.argsort(_Q5_K_FIFTH))]
        fields = fields | (bits.reshape(geo.row_tiles, geo.groups, -1) << 4)
    values = fields[..., xp.asarray(_CODE_INVERSE[code])]
    values = values.reshape(geo.row_tiles, geo.groups, TILE_ROWS, geo.group).transpose(0, 2, 1, 3)
    values = values.reshape(geo.row_tiles * TILE_ROWS, geo.groups, geo.group)[:rows]
    if code in (Q4_K, Q5_K):
        blocks = geo.groups // 4
        v = (values & np.uint8(15)).reshape(rows, blocks, 4, 2, 32)
        qs = (v[:, :, :, 0] | (v[:, :, :, 1] << 4)).astype(xp.uint8).reshape(rows, blocks, -1)
        heads = _heads(tiled, geo).transpose(0, 3, 2, 1, 4)
        parts = [heads.reshape(geo.row_tiles * TILE_ROWS, blocks, _Q4_K_HEAD)[:rows]]
        if code == Q5_K:  # bit b of high byte l: the fifth bit of weight 32 b + l
            fifth = (values >> 4).reshape(rows, blocks, 8, 32)
            shifts = xp.arange(8, dtype=xp.uint8).reshape(8, 1)
            parts.append((fifth << shifts).sum(axis=2, dtype=xp.uint8))
        return xp.concatenate([*parts, qs], axis=-1).reshape(-1)
    if code == Q6_K:
        v = values.reshape(rows, geo.groups // 4, 256)
        v4 = (v & np.uint8(15)).reshape(rows, -1, 2, 2, 64)
        ql = (v4[:, :, :, 0] | (v4[:, :, :, 1] << 4)).astype(xp.uint8)
        vh = (v >> 4).reshape(rows, -1, 2, 4, 32)
        shifts = xp.asarray(np.array([[0], [2], [4], [6]], dtype=np.uint8))
        qh = (vh << shifts).sum(axis=3, dtype=xp.uint8)
        parts = [ql.reshape(rows, -1, 128), qh.reshape(rows, -1, 64), scales]
        return xp.concatenate(parts, axis=-1).reshape(-1)
    stored = row_split_geometry(_NAMES[code], (rows, columns))
    gpr = stored.groups_per_row
    values = values[:, :gpr]
    out = xp.zeros(stored.size, dtype=xp.uint8)
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


def _pack_q5(xp: ModuleType, fields: Any, out: Any, geo: TileGeometry, t0: int) -> None:
    """Row tiles t0 .. of q5 codes (fields in q4's code order, [n, groups, 1024]) into the
    code plane (words 0-3 of each lane) and the q5 plane (word 4, four groups a 16-byte load)."""
    n = fields.shape[0]
    spread = fields.reshape(n, geo.groups, -1, 1) >> xp.arange(5, dtype=xp.uint8)
    bits = (spread & 1).reshape(n, geo.groups, -1)[..., xp.asarray(_Q5_BITS)]
    words = _pack_fields(xp, bits, 1).view(xp.uint32).reshape(n, geo.groups, LANES, 5)
    codes = out[: geo.high_offset].view(xp.uint32).reshape(geo.row_tiles, geo.groups, LANES, 4)
    codes[t0 : t0 + n] = words[..., :4]
    fifth = out[geo.high_offset : geo.scale_offset].view(xp.uint32)
    fifth = fifth.reshape(geo.row_tiles, geo.groups // 4, LANES, 4)
    fifth[t0 : t0 + n] = words[..., 4].reshape(n, geo.groups // 4, 4, LANES).transpose(0, 1, 3, 2)


def _unpack_q5(xp: ModuleType, tiled: Any, words: Any, geo: TileGeometry) -> Any:
    """q5 codes in q4's code order ([row tiles, groups, 1024]) from a tiled object."""
    fifth = tiled[geo.high_offset : geo.scale_offset].view(xp.uint32)
    fifth = fifth.reshape(geo.row_tiles, geo.groups // 4, LANES, 4).transpose(0, 1, 3, 2)
    lanes = xp.concatenate(
        [
            words.reshape(geo.row_tiles, geo.groups, LANES, 4),
            fifth.reshape(geo.row_tiles, geo.groups, LANES, 1),
        ],
        axis=-1,
    )
    bits = _unpack_fields(xp, lanes.reshape(geo.row_tiles, geo.groups, -1), 1, 160 * LANES)
    bits = bits[..., xp.asarray(_Q5_INVERSE)].reshape(geo.row_tiles, geo.groups, -1, 5)
    return (bits << xp.arange(5, dtype=xp.uint8)).sum(axis=-1, dtype=xp.uint8)
