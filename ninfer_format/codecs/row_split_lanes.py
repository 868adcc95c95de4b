"""Lanes of ``row_split_k128_v1``: codes and scales into and out of the planes, values by table.

Decoding is table driven: a byte holds two 4-bit lanes, so a 256-entry table of lane pairs
turns the base plane into codes (or directly into float32 values) with one ``np.take``.
"""

from __future__ import annotations

import numpy as np

from ..numeric import NF4_CODEBOOK, f16_to_f32
from .row_split_formats import RowSplitFormat, RowSplitGeometry


def _nibble_pairs() -> np.ndarray:
    byte = np.arange(256, dtype=np.uint8)
    return np.stack([byte & 0xF, byte >> 4], axis=1)


_U4_PAIRS = _nibble_pairs()  # [256, 2] unsigned lanes (even lane = low nibble)
_Q4_PAIRS_F32 = np.where(_U4_PAIRS >= 8, _U4_PAIRS.astype(np.int16) - 16, _U4_PAIRS).astype(
    np.float32
)
_NF4_PAIRS_F32 = NF4_CODEBOOK[_U4_PAIRS]
_U2_QUADS = np.stack(  # [256, 4] two-bit fields, lowest first (q6 high plane)
    [(np.arange(256) >> shift) & 3 for shift in (0, 2, 4, 6)], axis=1
).astype(np.uint8)


def pack_planes(
    fmt: RowSplitFormat, geo: RowSplitGeometry, codes: np.ndarray, scales: np.ndarray
) -> bytes:
    """Checked codes ``[N, K]`` and scale words ``[N, ceil(K/G)]`` as the object's bytes, with
    the padding spec 4.2 prescribes: pad lanes the zero code, wholly padded groups scale 0x0000,
    gaps zero."""
    lanes = np.full((geo.rows, geo.padded_columns), fmt.pad_code, dtype=np.uint8)
    lanes[:, : geo.columns] = codes.astype(np.int16) & ((1 << fmt.bits) - 1)
    out = np.zeros(geo.size, dtype=np.uint8)
    if fmt.bits == 8:
        out[: geo.base_bytes] = lanes.reshape(-1)
    else:
        pairs = (lanes & 0xF).reshape(-1, 2)
        out[: geo.base_bytes] = pairs[:, 0] | (pairs[:, 1] << 4)
    high_plane = out[geo.high_offset : geo.high_offset + geo.high_bytes]
    if fmt.bits == 5:
        high_plane[:] = np.packbits((lanes >> 4).reshape(-1), bitorder="little")
    elif fmt.bits == 6:
        quads = (lanes >> 4).reshape(-1, 4)
        high_plane[:] = quads[:, 0] | (quads[:, 1] << 2) | (quads[:, 2] << 4) | (quads[:, 3] << 6)
    words = np.zeros((geo.rows, geo.groups_per_row), dtype="<u2")
    words[:, : geo.real_groups] = scales
    out[geo.scale_offset :] = words.reshape(-1).view(np.uint8)
    return out.tobytes()


def unpack_planes(
    fmt: RowSplitFormat, geo: RowSplitGeometry, raw: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Codes ``[N, K]`` and scale words ``[N, ceil(K/G)]`` of the object's bytes, unpadded."""
    # Copies: q8 codes would otherwise be a view of the caller's (maybe mapped) bytes.
    codes = padded_codes(fmt, geo, raw)[:, : geo.columns].copy()
    scales = padded_scales(geo, raw)[:, : geo.real_groups].copy()
    return codes, scales


def decode_values(fmt: RowSplitFormat, geo: RowSplitGeometry, raw: np.ndarray) -> np.ndarray:
    """Float32 values ``[N, K]``: 4-bit formats straight from the pair tables, wider codes
    unpacked first."""
    scales = f16_to_f32(padded_scales(geo, raw))[:, :, None]
    grouped = (geo.rows, geo.groups_per_row, fmt.group)
    with np.errstate(all="ignore"):  # Inf/NaN scales of invalid objects decode as such
        if fmt.bits == 4:
            table = _NF4_PAIRS_F32 if fmt.nf4 else _Q4_PAIRS_F32
            values = np.take(table, raw[: geo.base_bytes], axis=0).reshape(grouped)
            values *= scales
        else:
            values = np.empty(grouped, dtype=np.float32)
            np.multiply(padded_codes(fmt, geo, raw).reshape(grouped), scales, out=values)
    values = values.reshape(geo.rows, geo.padded_columns)
    if geo.columns == geo.padded_columns:
        return values
    return np.ascontiguousarray(values[:, : geo.columns])


def padded_scales(geo: RowSplitGeometry, raw: np.ndarray) -> np.ndarray:
    plane = raw[geo.scale_offset :].view("<u2").astype(np.uint16)
    return plane.reshape(geo.rows, geo.groups_per_row)


def padded_codes(fmt: RowSplitFormat, geo: RowSplitGeometry, raw: np.ndarray) -> np.ndarray:
    """All ``[N, K_pad]`` lanes: signed int8 codes, or uint8 indices for nf4."""
    everything = (slice(None), slice(None))
    return group_lanes(fmt, geo, raw, everything).reshape(geo.rows, geo.padded_columns)


def group_lanes(
    fmt: RowSplitFormat, geo: RowSplitGeometry, raw: np.ndarray, select: tuple
) -> np.ndarray:
    """Lanes ``[..., G]`` of the groups picked by ``select``, an index into ``[N, groups]``
    (slices for everything, index arrays for a few groups, as the scan needs)."""
    grid = (geo.rows, geo.groups_per_row)
    base = raw[: geo.base_bytes].reshape(*grid, -1)[select]
    if fmt.bits == 8:
        return base.view(np.int8)
    lanes = np.take(_U4_PAIRS, base, axis=0).reshape(*base.shape[:-1], fmt.group)
    if fmt.nf4:
        return lanes
    if fmt.bits > 4:
        high = raw[geo.high_offset : geo.high_offset + geo.high_bytes].reshape(*grid, -1)[select]
        if fmt.bits == 5:
            bits = np.unpackbits(high, axis=-1, bitorder="little")
        else:
            bits = np.take(_U2_QUADS, high, axis=0).reshape(lanes.shape)
        np.left_shift(bits, 4, out=bits)
        lanes |= bits
    # Two's complement sign extension of a b-bit word held in a byte, in place.
    half = 1 << (fmt.bits - 1)
    lanes ^= np.uint8(half)
    signed = lanes.view(np.int8)
    signed -= np.int8(half)
    return signed
