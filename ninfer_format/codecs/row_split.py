"""``row_split_k128_v1``: grouped integer codes in planes (base nibbles/bytes, high bits, scales).

Formats: q4/q5/q6 (G = 64), q8 (G = 32), all CORE, and the project's ``nf4_g64_fp16``
(decision 4: q4's byte geometry, the nibble indexes the NF4 codebook). Rows are padded to a
multiple of 128 columns so the GPU kernels can read whole 128-column tiles; the padding is part
of the object and must be zero (NF4: code 7, the zero level).

Decoding is table driven: a byte holds two 4-bit lanes, so a 256-entry table of lane pairs
turns the base plane into codes (or directly into float32 values) with one ``np.take``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CodecError
from ..framing import align_up
from ..numeric import NF4_CODEBOOK, NF4_ZERO_CODE, f16_to_f32, f32_to_f16, nf4_nearest
from .direct import (
    ALIGNMENT,
    FLOAT32,
    as_object_bytes,
    check_dims,
    check_single_divisor,
    codec_error,
    nonzero_gap_findings,
    shape_text,
    where_text,
)
from .registry import Finding, Profile, register

LAYOUT = "row_split_k128_v1"
ROW_TILE = 128
# Rows are quantized in slices of about this many values, to bound the encoder's temporaries.
_ENCODE_CHUNK_VALUES = 1 << 22


@dataclass(frozen=True)
class RowSplitFormat:
    name: str
    bits: int
    group: int  # G: lanes per group, along K
    base_bytes: int  # B: base-plane bytes per group
    high_bytes: int  # H: high-bit-plane bytes per group
    qmin: int
    qmax: int
    profile: Profile
    nf4: bool = False

    @property
    def pad_code(self) -> int:
        return NF4_ZERO_CODE if self.nf4 else 0


FORMATS: dict[str, RowSplitFormat] = {
    f.name: f
    for f in (
        RowSplitFormat("q4_g64_fp16", 4, 64, 32, 0, -8, 7, "CORE"),
        RowSplitFormat("q5_g64_fp16", 5, 64, 32, 8, -16, 15, "CORE"),
        RowSplitFormat("q6_g64_fp16", 6, 64, 32, 16, -32, 31, "CORE"),
        RowSplitFormat("q8_g32_fp16", 8, 32, 32, 0, -127, 127, "CORE"),
        RowSplitFormat("nf4_g64_fp16", 4, 64, 32, 0, 0, 15, "ninfer", nf4=True),
    )
}


@dataclass(frozen=True)
class RowSplitGeometry:
    """Byte offsets of the three planes of one ``[N, K]`` object (spec 4.2)."""

    rows: int
    columns: int
    padded_columns: int  # K_pad = align_up(K, 128)
    groups_per_row: int  # gpr = K_pad / G, including wholly padded groups
    real_groups: int  # ceil(K / G): groups holding at least one real column
    base_bytes: int
    high_offset: int
    high_bytes: int
    scale_offset: int
    size: int


def row_split_geometry(format: str, shape: tuple[int, int]) -> RowSplitGeometry:
    """Plane offsets for ``format`` at ``shape`` (also what the GPU loader slices by)."""
    codec = _codec(format)
    return codec.geometry(shape)


def _codec(format: str) -> RowSplitCodec:
    codec = CODECS.get(format)
    if codec is None:
        raise CodecError(f"format {format!r} has no {LAYOUT} codec (known: {sorted(CODECS)})")
    return codec


# --- lane tables ------------------------------------------------------------------------------


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


# --- pack / unpack ----------------------------------------------------------------------------


def pack_row_split(format: str, codes: np.ndarray, scales: np.ndarray) -> bytes:
    """Lay out codes ``[N, K]`` and binary16 scale words ``[N, ceil(K/G)]`` as an object.

    q formats take signed codes in ``[qmin, qmax]`` (-128 is rejected for q8); nf4 takes
    codebook indices 0..15. Padding is written exactly as spec 4.2 prescribes, so the bytes are
    reproducible: pad lanes get the zero code, wholly padded groups scale 0x0000, gaps zero.
    """
    codec = _codec(format)
    fmt = codec.spec
    codes = np.asarray(codes)
    if codes.ndim != 2 or not np.issubdtype(codes.dtype, np.integer):
        raise codec_error(
            codec, f"codes must be a rank-2 integer array, got {codes.dtype} {codes.shape}"
        )
    geo = codec.geometry(codes.shape)
    scales = np.asarray(scales)
    want = (geo.rows, geo.real_groups)
    if scales.shape != want or not np.issubdtype(scales.dtype, np.integer):
        raise codec_error(
            codec,
            f"scales must be integer binary16 words of shape {shape_text(want)}, "
            f"got {scales.dtype} {shape_text(scales.shape)}",
        )
    if codes.size and (codes.min() < fmt.qmin or codes.max() > fmt.qmax):
        raise codec_error(codec, f"codes must lie in [{fmt.qmin}, {fmt.qmax}]")
    if scales.size and (scales.min() < 0 or scales.max() > 0xFFFF):
        raise codec_error(codec, "scale words must lie in [0, 0xFFFF]")

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


def unpack_row_split(
    format: str, data: np.ndarray, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Codes ``[N, K]`` (int8; nf4: uint8 indices) and scale words ``[N, ceil(K/G)]`` (uint16).

    Inverse of ``pack_row_split``; padding is dropped (``scan`` reports it).
    """
    codec = _codec(format)
    geo = codec.geometry(shape)
    raw = as_object_bytes(codec, data, geo.size)
    # Copies: q8 codes would otherwise be a view of the caller's (maybe mapped) bytes.
    codes = _padded_codes(codec.spec, geo, raw)[:, : geo.columns].copy()
    scales = _padded_scales(geo, raw)[:, : geo.real_groups].copy()
    return codes, scales


def _padded_scales(geo: RowSplitGeometry, raw: np.ndarray) -> np.ndarray:
    plane = raw[geo.scale_offset :].view("<u2").astype(np.uint16)
    return plane.reshape(geo.rows, geo.groups_per_row)


def _padded_codes(fmt: RowSplitFormat, geo: RowSplitGeometry, raw: np.ndarray) -> np.ndarray:
    """All ``[N, K_pad]`` lanes: signed int8 codes, or uint8 indices for nf4."""
    everything = (slice(None), slice(None))
    return _group_lanes(fmt, geo, raw, everything).reshape(geo.rows, geo.padded_columns)


def _group_lanes(
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


# --- the codec --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowSplitCodec:
    spec: RowSplitFormat
    layout: str = LAYOUT
    alignment: int = ALIGNMENT
    decoded_dtype: np.dtype = FLOAT32

    @property
    def format(self) -> str:
        return self.spec.name

    @property
    def profile(self) -> Profile:
        return self.spec.profile

    @property
    def bits_per_weight(self) -> float:
        return self.spec.bits + 16 / self.spec.group

    def geometry(self, shape: tuple[int, ...], divisors: int = 1) -> RowSplitGeometry:
        check_single_divisor(self, divisors)
        n, k = check_dims(self, shape, rank=2)
        fmt = self.spec
        k_pad = align_up(k, ROW_TILE)
        gpr = k_pad // fmt.group
        base_bytes = n * gpr * fmt.base_bytes
        high_bytes = n * gpr * fmt.high_bytes
        high_offset = align_up(base_bytes, ALIGNMENT)
        scale_offset = high_offset + align_up(high_bytes, ALIGNMENT)
        return RowSplitGeometry(
            rows=n,
            columns=k,
            padded_columns=k_pad,
            groups_per_row=gpr,
            real_groups=-(-k // fmt.group),
            base_bytes=base_bytes,
            high_offset=high_offset,
            high_bytes=high_bytes,
            scale_offset=scale_offset,
            size=scale_offset + n * gpr * 2,
        )

    def check_shape(self, shape: tuple[int, ...], divisors: int = 1) -> None:
        self.geometry(shape, divisors)

    def encoded_size(self, shape: tuple[int, ...], divisors: int = 1) -> int:
        return self.geometry(shape, divisors).size

    def decode(self, data: np.ndarray, shape: tuple[int, ...], divisors: int = 1) -> np.ndarray:
        """``w = f32(scale) * code``, a signed product: EXT-ALL negative scales decode too."""
        geo = self.geometry(shape, divisors)
        raw = as_object_bytes(self, data, geo.size)
        fmt = self.spec
        scales = f16_to_f32(_padded_scales(geo, raw))[:, :, None]
        grouped = (geo.rows, geo.groups_per_row, fmt.group)
        with np.errstate(all="ignore"):  # Inf/NaN scales of invalid objects decode as such
            if fmt.bits == 4:
                table = _NF4_PAIRS_F32 if fmt.nf4 else _Q4_PAIRS_F32
                values = np.take(table, raw[: geo.base_bytes], axis=0).reshape(grouped)
                values *= scales
            else:
                values = np.empty(grouped, dtype=np.float32)
                np.multiply(_padded_codes(fmt, geo, raw).reshape(grouped), scales, out=values)
        values = values.reshape(geo.rows, geo.padded_columns)
        if geo.columns == geo.padded_columns:
            return values
        return np.ascontiguousarray(values[:, : geo.columns])

    def encode(self, values: np.ndarray, divisors: int = 1) -> bytes:
        codes, scales = grouped_absmax(self.format, values, divisors)
        return pack_row_split(self.format, codes, scales)

    def scan(self, data: np.ndarray, shape: tuple[int, ...], divisors: int = 1) -> list[Finding]:
        geo = self.geometry(shape, divisors)
        raw = as_object_bytes(self, data, geo.size)
        return _scan(self, geo, raw)


# --- reference encoder ------------------------------------------------------------------------


def grouped_absmax(
    format: str, values: np.ndarray, divisors: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Spec 3.2 ``grouped_absmax`` (nf4: absmax scale, nearest level): codes and scale words.

    Returns what ``pack_row_split`` takes, so scale-search methods can reuse the code rule.
    """
    codec = _codec(format)
    x = _finite_f32(codec, values)
    geo = codec.geometry(x.shape, divisors)
    codes = np.empty((geo.rows, geo.columns), dtype=np.uint8 if codec.spec.nf4 else np.int8)
    scales = np.empty((geo.rows, geo.real_groups), dtype=np.uint16)
    step = max(1, _ENCODE_CHUNK_VALUES // geo.columns)
    for start in range(0, geo.rows, step):
        rows = slice(start, start + step)
        codes[rows], scales[rows] = _absmax_rows(codec, x[rows], geo.real_groups)
    return codes, scales


def _finite_f32(codec: RowSplitCodec, values: np.ndarray) -> np.ndarray:
    values = np.asarray(values)
    if not (np.issubdtype(values.dtype, np.floating) or np.issubdtype(values.dtype, np.integer)):
        raise codec_error(codec, f"cannot encode values of dtype {values.dtype}")
    with np.errstate(over="ignore"):
        x = values.astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise codec_error(codec, "cannot encode non-finite values (or values beyond float32)")
    return x


def _absmax_rows(
    codec: RowSplitCodec, x: np.ndarray, real_groups: int
) -> tuple[np.ndarray, np.ndarray]:
    fmt = codec.spec
    rows, columns = x.shape
    padded = np.zeros((rows, real_groups * fmt.group), dtype=np.float32)
    padded[:, :columns] = x  # zeros never change a group's absmax
    groups = padded.reshape(rows, real_groups, fmt.group)
    amax = np.abs(groups).max(axis=2)
    if fmt.nf4:
        words = f32_to_f16(amax)
    else:
        words = f32_to_f16((amax.astype(np.float64) / fmt.qmax).astype(np.float32))
    words[(words == 0) & (amax > 0)] = 0x0001  # underflow rescue: 2^-24
    if np.any(words == 0x7C00):
        raise codec_error(codec, "a group's scale overflows binary16 (absmax too large)")
    scale = f16_to_f32(words)
    with np.errstate(divide="ignore"):
        inv = np.where(words == 0, np.float32(0), np.float32(1) / scale)
    y = groups * inv[:, :, None]  # reciprocal-then-multiply is normative
    if fmt.nf4:
        return nf4_nearest(y).reshape(rows, -1)[:, :columns], words
    codes = np.clip(np.rint(y), fmt.qmin, fmt.qmax).astype(np.int8)
    return codes.reshape(rows, -1)[:, :columns], words


# --- scan ------------------------------------------------------------------------------------


def _scan(codec: RowSplitCodec, geo: RowSplitGeometry, raw: np.ndarray) -> list[Finding]:
    """Scale checks read only the scale plane; code checks decode only the groups they concern
    (zero-scale groups, padded groups), so verifying runs near memory speed."""
    fmt = codec.spec
    findings: list[Finding] = []
    words = _padded_scales(geo, raw)
    real = geo.real_groups
    scale = words[:, :real]

    magnitude = scale & 0x7FFF
    non_finite = magnitude >= 0x7C00
    if non_finite.any():
        findings.append(Finding("error", "scale is Inf or NaN: " + where_text(non_finite)))
    minus_zero = scale == 0x8000
    if minus_zero.any():
        findings.append(Finding("error", "scale is -0 (0x8000): " + where_text(minus_zero)))
    negative = (scale >= 0x8000) & (magnitude != 0) & ~non_finite
    if negative.any():
        if fmt.nf4:
            findings.append(Finding("error", "negative scale: " + where_text(negative)))
        else:
            text = "negative scale (EXT-ALL dialect): " + where_text(negative)
            findings.append(Finding("warning", text))

    def off_pad_counts(rows: np.ndarray, groups: np.ndarray, real_lanes: bool) -> np.ndarray:
        lanes = _group_lanes(fmt, geo, raw, (rows, groups))
        column = groups[:, None] * fmt.group + np.arange(fmt.group)
        in_range = (column < geo.columns) == real_lanes
        counts = np.zeros((geo.rows, geo.groups_per_row), dtype=np.int64)
        counts[rows, groups] = ((lanes != fmt.pad_code) & in_range).sum(axis=1)
        return counts

    rows, groups = np.nonzero(scale == 0)
    if rows.size:
        bad = off_pad_counts(rows, groups, real_lanes=True)[:, :real]
        if bad.any():
            text = "non-zero codes in groups whose scale is +0: " + where_text(bad, "lanes")
            findings.append(Finding("error", text))
    if fmt.bits == 8:
        minus_128 = raw[: geo.base_bytes] == 0x80
        if minus_128.any():
            lanes = minus_128.reshape(geo.rows, geo.groups_per_row, fmt.group)
            column = np.arange(geo.padded_columns).reshape(geo.groups_per_row, fmt.group)
            illegal = (lanes & (column < geo.columns)).sum(axis=2)[:, :real]
            if illegal.any():
                text = "illegal code 0x80 (-128): " + where_text(illegal, "lanes")
                findings.append(Finding("error", text))

    if geo.columns < geo.padded_columns:
        first = geo.columns // fmt.group
        rows, groups = np.meshgrid(
            np.arange(geo.rows), np.arange(first, geo.groups_per_row), indexing="ij"
        )
        pad_lanes = off_pad_counts(rows.ravel(), groups.ravel(), real_lanes=False)
        if pad_lanes.any():
            zero = "code 7" if fmt.nf4 else "0"
            text = f"non-zero padding: lanes at columns >= {geo.columns} not {zero}: "
            findings.append(Finding("warning", text + where_text(pad_lanes, "lanes")))
    pad_scales = words[:, real:] != 0
    if pad_scales.any():
        text = "non-zero padding: scale of wholly padded groups not 0x0000: "
        counts = np.zeros(words.shape, dtype=np.int64)
        counts[:, real:] = pad_scales
        findings.append(Finding("warning", text + where_text(counts)))
    findings += nonzero_gap_findings(
        raw,
        [
            (geo.base_bytes, geo.high_offset, "gap after the base plane"),
            (geo.high_offset + geo.high_bytes, geo.scale_offset, "gap after the high-bit plane"),
        ],
    )
    return findings


CODECS: dict[str, RowSplitCodec] = {name: RowSplitCodec(spec) for name, spec in FORMATS.items()}
for _codec_object in CODECS.values():
    register(_codec_object)
