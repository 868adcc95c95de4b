"""Tile packing of the GGUF blocks (q4_k, q5_k, q6_k and iq2_xxs): their stored rows read as
codes and block heads, and the planes beside the codes (fifth bits, high bits, records of
scales). ``tiles.py`` describes the layouts and packs and unpacks whole objects with these.

Array operations only (numpy or CuPy alike), as all of tile packing.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from .tile_layout import (
    _IQ2_XXS_BLOCK,
    _IQ2_XXS_RECORD,
    _Q4_K_BLOCK,
    _Q4_K_HEAD,
    _Q5_K_BLOCK,
    _Q6_K_BLOCK,
    _Q6_K_RECORD,
    CHUNK_TILES,
    LANES,
    Q5_K,
    TILE_ROWS,
    TileGeometry,
)
from .tile_orders import _Q6_HIGH, _pack_fields, _unpack_fields


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
