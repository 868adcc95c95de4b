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
Q4_K, Q5_K, Q6_K = (F.GGUF_CODES[f"gguf_q{b}_k"] for b in (4, 5, 6))
IQ2_XXS = F.GGUF_CODES["gguf_iq2_xxs"]
#: bytes of a q4_k/q5_k block's head (d, dmin, scales), and of the blocks
_Q4_K_HEAD, _Q4_K_BLOCK, _Q5_K_BLOCK = 16, 144, 176
#: bytes of a q6_k block (low nibbles, high bits, scales, d) and of a tile's record of scales
_Q6_K_BLOCK, _Q6_K_RECORD = 210, 288
#: bytes of an iq2_xxs block and of a tile's record of scales
_IQ2_XXS_BLOCK, _IQ2_XXS_RECORD = 66, 96
#: the codes the tile kernels read
TILED_CODES = frozenset({*_NAMES, Q4_K, Q5_K, Q6_K, IQ2_XXS})
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
    row_tiles = -(-rows // TILE_ROWS)
    if code in (Q4_K, Q5_K):  # (columns: whole blocks, as the codec requires)
        groups = columns // 64
        codes = row_tiles * groups * TILE_CODE_BYTES
        high = codes + (row_tiles * groups * LANES * 4 if code == Q5_K else 0)
        heads = row_tiles * (groups // 4) * TILE_ROWS * _Q4_K_HEAD
        return TileGeometry(code, rows, columns, 64, groups, row_tiles, codes, high, high + heads)
    if code == IQ2_XXS:  # (no code plane: the lane's words are in the second)
        groups = columns // 64
        words = row_tiles * groups * LANES * 8
        records = row_tiles * (groups // 4) * _IQ2_XXS_RECORD
        return TileGeometry(code, rows, columns, 64, groups, row_tiles, 0, words, words + records)
    if code == Q6_K:
        groups = columns // 64
        codes = row_tiles * groups * TILE_CODE_BYTES
        high = codes + row_tiles * groups * LANES * 8
        records = row_tiles * (groups // 4) * _Q6_K_RECORD
        return TileGeometry(code, rows, columns, 64, groups, row_tiles, codes, high, high + records)
    fmt = FORMATS[_NAMES[code]]
    geo = row_split_geometry(fmt.name, (rows, columns))
    groups = -(-geo.groups_per_row // 4) * 4
    codes = row_tiles * groups * TILE_CODE_BYTES
    high = row_tiles * groups * LANES * 4 if code == F.Q5 else 0
    scales = row_tiles * groups * TILE_ROWS * 2
    return TileGeometry(
        code, rows, columns, fmt.group, groups, row_tiles, codes, codes + high,
        codes + high + scales,
    )  # fmt: skip


def tiled_planes(code: int, rows: int, columns: int) -> F.Planes:
    """The kernel arguments of a tiled object: off1 the high bits, off2 the scales (q4_k,
    q5_k: the block heads; q6_k: its records), stride the (padded) groups per row."""
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
    if code in (Q4_K, Q5_K):  # mma j within sub-block j // 2
        k = 32 * (j // 2) + 8 * t + 4 * (j % 2) + 2 * (pair // 2) + second
    elif code == Q6_K:  # mma j on sub-block j
        k = 16 * j + 4 * t + 2 * (pair // 2) + second
    else:
        k = 16 * t + 4 * j + 2 * (pair // 2) + second
    return (row * 64 + k).reshape(-1)


def _q5_bits() -> np.ndarray:
    """For each bit of a q5 tile in stored order (lane, its 160 bits: words 0-4), the
    (index into ``_code_order(Q4)``'s fields, code bit) it holds, as field * 5 + code bit."""
    out = np.empty((LANES, 160), dtype=np.int64)
    for lane in range(LANES):
        for pair in range(16):
            j, i = divmod(pair, 4)
            for second in range(2):
                field = lane * 32 + j * 8 + i + 4 * second  # q4's (lane, word j, nibble)
                for b in range(5):
                    if pair < 15:
                        w, f = divmod(pair, 3)
                        at = 32 * w + 16 * second + 5 * f + b
                    else:
                        at = 32 * b + 15 + 16 * second
                    out[lane, at] = field * 5 + b
    return out.reshape(-1)


def _q6_high() -> np.ndarray:
    """For each 2-bit field of a lane's two q6_k high words (word w, half, field f), the index
    into the lane's fields in ``_code_order``'s order (word j, nibble n) whose high bits it
    holds: mma j = 2 w + f // 4, pair f % 4, the half its element."""
    w, half, f = np.meshgrid(np.arange(2), np.arange(2), np.arange(8), indexing="ij")
    j, pair = 2 * w + f // 4, f % 4
    return (8 * j + pair + 4 * half).reshape(-1)


def _q5_k_fifth() -> np.ndarray:
    """For each bit of a lane's q5_k fifth-bit word, the index into the lane's fields in
    ``_code_order``'s order (word j, nibble n) whose fifth bit it holds: bit 16 h + 4 j + i
    is element h of pair i of mma j."""
    half, j, i = np.meshgrid(np.arange(2), np.arange(4), np.arange(4), indexing="ij")
    return (8 * j + i + 4 * half).reshape(-1)


_CODE_ORDER = {code: _code_order(code) for code in TILED_CODES}
#: the lane's 32 fields, in the order of its two high words
_Q6_HIGH = _q6_high()
#: the lane's 32 fields, in the order of its q5_k fifth-bit word
_Q5_K_FIFTH = _q5_k_fifth()
_CODE_INVERSE = {code: np.argsort(order) for code, order in _CODE_ORDER.items()}
_Q5_BITS = _q5_bits()
_Q5_INVERSE = np.argsort(_Q5_BITS)  # (field, code bit) -> its bit of the tile


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


def _q4_k_rows(
    xp: ModuleType, raw: Any, code: int, columns: int, r0: int, r1: int
) -> tuple[Any, Any]:
    """Rows r0 .. r1 - 1 of a stored q4_k or q5_k object: codes [n, groups, 64] (group q is
    64-weight chunk q % 4 of block q // 4: sub-block 2 (q % 4) the low nibbles, the next the
    high ones; q5_k's fifth bit of sub-block b is bit b of its 32 high bytes) and the blocks'
    heads [n, blocks, 16]."""
    size = _Q5_K_BLOCK if code == Q5_K else _Q4_K_BLOCK
    per_row, n = columns // 256, r1 - r0
    blocks = raw[r0 * per_row * size : r1 * per_row * size].reshape(n, per_row, size)
    qs = blocks[..., size - 128 :].reshape(n, per_row, 4, 1, 32)
    codes = xp.concatenate([qs & 15, qs >> 4], axis=3).reshape(n, per_row, 256)
    if code == Q5_K:
        qh = blocks[..., _Q4_K_HEAD : _Q4_K_HEAD + 32].reshape(n, per_row, 1, 32)
        fifth = (qh >> xp.arange(8, dtype=xp.uint8).reshape(8, 1)) & 1
        codes = codes | (fifth.reshape(n, per_row, 256) << 4)
    return codes.reshape(n, per_row * 4, 64), blocks[..., :_Q4_K_HEAD]


def _fifth(out: Any, geo: TileGeometry) -> Any:
    """q5_k's fifth-bit plane as uint32 [row tiles, blocks, lane, 4 groups]."""
    plane = out[geo.high_offset : geo.scale_offset].view(np.uint32)
    return plane.reshape(geo.row_tiles, geo.groups // 4, LANES, 4)


def _q6_k_rows(xp: ModuleType, raw: Any, columns: int, r0: int, r1: int) -> tuple[Any, Any]:
    """Rows r0 .. r1 - 1 of a stored q6_k object: codes c = q + 32 [n, groups, 64] and each
    block's sixteen scales and d [n, blocks, 18]."""
    per_row, n = columns // 256, r1 - r0
    blocks = raw[r0 * per_row * _Q6_K_BLOCK : r1 * per_row * _Q6_K_BLOCK]
    blocks = blocks.reshape(n, per_row, _Q6_K_BLOCK)
    ql = blocks[..., :128].reshape(n, per_row, 2, 1, 64)  # weight 128 h + 64 s + b
    low = xp.concatenate([ql & 15, ql >> 4], axis=3).reshape(n, per_row, 256)
    qh = blocks[..., 128:192].reshape(n, per_row, 2, 1, 32)  # weight 128 h + 32 s + b
    high = (qh >> xp.asarray(np.array([[0], [2], [4], [6]], dtype=np.uint8))) & 3
    codes = low | (high.reshape(n, per_row, 256) << 4)
    return codes.reshape(n, per_row * 4, 64), blocks[..., 192:]


def _pack_q6_k(
    xp: ModuleType, fields: Any, scales: Any, out: Any, geo: TileGeometry, t0: int
) -> None:
    """Row tiles t0 .. of q6_k: the codes' high bits (fields in code order, [n, groups,
    1024]) into the high plane, the rows' scales and d ([rows, blocks, 18]) into records."""
    n, blocks = fields.shape[0], geo.groups // 4
    bits = (fields >> 4).reshape(n, geo.groups, LANES, 32)[..., xp.asarray(_Q6_HIGH)]
    words = _pack_fields(xp, bits, 2).view(xp.uint32).reshape(n, blocks, 4, LANES, 2)
    high = out[geo.high_offset : geo.scale_offset].view(xp.uint32)
    high = high.reshape(geo.row_tiles, blocks, LANES, 4, 2)
    high[t0 : t0 + n] = words.transpose(0, 1, 3, 2, 4)
    full = xp.zeros((n * TILE_ROWS, blocks, 18), dtype=xp.uint8)
    full[: scales.shape[0]] = scales
    full = full.reshape(n, 2, 8, blocks, 18)
    records = out[geo.scale_offset :].reshape(geo.row_tiles, blocks, _Q6_K_RECORD)
    records[t0 : t0 + n, :, :256] = full[..., :16].transpose(0, 3, 2, 1, 4).reshape(n, blocks, 256)
    records[t0 : t0 + n, :, 256:] = full[..., 16:].transpose(0, 3, 1, 2, 4).reshape(n, blocks, 32)


def _unpack_q6_k(xp: ModuleType, tiled: Any, low: Any, geo: TileGeometry) -> tuple[Any, Any]:
    """q6_k's codes in code order ([row tiles, groups, 1024]) from the low nibbles and the
    high plane, and the rows' scales and d ([rows, blocks, 18])."""
    blocks = geo.groups // 4
    high = tiled[geo.high_offset : geo.scale_offset].view(xp.uint32)
    high = high.reshape(geo.row_tiles, blocks, LANES, 4, 2).transpose(0, 1, 3, 2, 4)
    bits = _unpack_fields(xp, high.reshape(geo.row_tiles, geo.groups, LANES, 2), 2, 32)
    bits = bits[..., xp.asarray(np.argsort(_Q6_HIGH))].reshape(geo.row_tiles, geo.groups, -1)
    records = tiled[geo.scale_offset :].reshape(geo.row_tiles, blocks, _Q6_K_RECORD)
    sc = records[..., :256].reshape(geo.row_tiles, blocks, 8, 2, 16).transpose(0, 3, 2, 1, 4)
    d = records[..., 256:].reshape(geo.row_tiles, blocks, 2, 8, 2).transpose(0, 2, 3, 1, 4)
    scales = xp.concatenate([sc, d], axis=-1).reshape(geo.row_tiles * TILE_ROWS, blocks, 18)
    return low | (bits << 4), scales[: geo.rows]


def _heads(out: Any, geo: TileGeometry) -> Any:
    """The head plane of a tiled q4_k/q5_k object as [row tiles, blocks, 8 g, 2 (g, g + 8),
    16]."""
    return out[geo.scale_offset :].reshape(geo.row_tiles, geo.groups // 4, 8, 2, _Q4_K_HEAD)


def _tile_rows(xp: ModuleType, heads: Any, tiles: int) -> Any:
    """Heads [n <= 16 tiles, blocks, 16] (rows past n zero) in the head plane's order."""
    full = xp.zeros((tiles * TILE_ROWS, *heads.shape[1:]), dtype=xp.uint8)
    full[: heads.shape[0]] = heads
    return full.reshape(tiles, 2, 8, *heads.shape[1:]).transpose(0, 3, 2, 1, 4)


def _iq2_xxs_view(geo: TileGeometry, out: Any) -> tuple[Any, Any]:
    """The lane words of a tiled iq2_xxs object as uint32 [row tiles, blocks, 8 g, 4 t, 4
    groups, 2 (indices, signs)] and its records [row tiles, blocks, 96]."""
    blocks = geo.groups // 4
    words = out[: geo.scale_offset].view(np.uint32)
    words = words.reshape(geo.row_tiles, blocks, 8, 4, 4, 2)
    return words, out[geo.scale_offset :].reshape(geo.row_tiles, blocks, _IQ2_XXS_RECORD)


def _pack_iq2_xxs(xp: ModuleType, raw: Any, geo: TileGeometry) -> Any:
    out = xp.zeros(geo.size, dtype=xp.uint8)
    words_out, records_out = _iq2_xxs_view(geo, out)
    blocks = geo.groups // 4
    bytes_ = xp.asarray(np.array([0, 8, 16, 24], dtype=np.uint32))
    sevens = xp.asarray(np.array([0, 7, 14, 21], dtype=np.uint32))
    for t0 in range(0, geo.row_tiles, CHUNK_TILES):
        t1 = min(geo.row_tiles, t0 + CHUNK_TILES)
        r0, r1 = t0 * TILE_ROWS, min(geo.rows, t1 * TILE_ROWS)
        nt = t1 - t0
        full = xp.zeros((nt * TILE_ROWS, blocks, _IQ2_XXS_BLOCK), dtype=xp.uint8)
        full[: r1 - r0] = raw[r0 * blocks * 66 : r1 * blocks * 66].reshape(r1 - r0, blocks, 66)
        sub = xp.ascontiguousarray(full[..., 2:]).view(xp.uint32).reshape(-1, blocks, 8, 2)
        grid = (sub[..., 0, None] >> bytes_) & 255  # [rows, blocks, 8 sub-blocks, 4 t]
        signs = (sub[..., 1, None] >> sevens) & 127
        # [rows (rr, g), blocks, sub-blocks (u, h), t] -> [tiles, blocks, g, t, u, (h, rr)]
        order = (0, 3, 2, 6, 4, 5, 1)
        grid = grid.reshape(nt, 2, 8, blocks, 4, 2, 4).transpose(order).reshape(-1, 4)
        signs = signs.reshape(nt, 2, 8, blocks, 4, 2, 4).transpose(order).reshape(-1, 4)
        shape = (nt, blocks, 8, 4, 4)
        words_out[t0:t1, ..., 0] = (grid << bytes_).sum(axis=-1, dtype=xp.uint32).reshape(shape)
        words_out[t0:t1, ..., 1] = (signs << sevens).sum(axis=-1, dtype=xp.uint32).reshape(shape)
        nibbles = (sub[..., 1] >> 28) << xp.arange(0, 32, 4, dtype=xp.uint32)
        scales = nibbles.sum(axis=-1, dtype=xp.uint32).reshape(nt, 2, 8, blocks)
        scales = xp.ascontiguousarray(scales.transpose(0, 3, 2, 1)).view(xp.uint8)
        records_out[t0:t1, :, :64] = scales.reshape(nt, blocks, 64)
        d = full[..., :2].reshape(nt, 2, 8, blocks, 2).transpose(0, 3, 1, 2, 4)
        records_out[t0:t1, :, 64:] = d.reshape(nt, blocks, 32)
    return out


def _unpack_iq2_xxs(xp: ModuleType, tiled: Any, geo: TileGeometry) -> Any:
    words, records = _iq2_xxs_view(geo, tiled)
    blocks = geo.groups // 4
    bytes_ = xp.asarray(np.array([0, 8, 16, 24], dtype=np.uint32))
    sevens = xp.asarray(np.array([0, 7, 14, 21], dtype=np.uint32))
    fields = [(words[..., 0, None] >> bytes_) & 255, (words[..., 1, None] >> sevens) & 127]
    # [tiles, blocks, g, t, u, (h, rr)] -> [rows (rr, g), blocks, sub-blocks (u, h), t]
    back = [
        f.reshape(geo.row_tiles, blocks, 8, 4, 4, 2, 2).transpose(0, 6, 2, 1, 4, 5, 3)
        for f in fields
    ]
    grid, signs = (b.reshape(-1, blocks, 8, 4) for b in back)
    scales = xp.ascontiguousarray(records[..., :64]).view(xp.uint32)
    scales = scales.reshape(geo.row_tiles, blocks, 8, 2).transpose(0, 3, 2, 1).reshape(-1, blocks)
    nibbles = (scales[..., None] >> xp.arange(0, 32, 4, dtype=xp.uint32)) & 15
    first = (grid << bytes_).sum(axis=-1, dtype=xp.uint32)
    second = (signs << sevens).sum(axis=-1, dtype=xp.uint32) | (nibbles << 28)
    sub = xp.stack([first, second], axis=-1).reshape(-1, blocks, 16)
    d = records[..., 64:].reshape(geo.row_tiles, blocks, 2, 8, 2).transpose(0, 2, 3, 1, 4)
    d = d.reshape(-1, blocks, 2)
    out = xp.concatenate([d, xp.ascontiguousarray(sub).view(xp.uint8)], axis=-1)
    return out[: geo.rows].reshape(-1)


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
