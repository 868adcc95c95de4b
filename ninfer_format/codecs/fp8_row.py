"""``row_scale_v1``: E4M3FN codes row-major, then one BF16 multiplier per row.

Codes come first and whole, so a row is one contiguous span of K bytes plus one scale word;
that is what lets packed parents (Q|K|gate|V) be sliced by rows without re-encoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..framing import align_up
from ..numeric import E4M3FN_MAX, E4M3FN_VALUES, bf16_to_f32, f32_to_bf16, f32_to_e4m3fn
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

FORMAT = "fp8_e4m3fn_row_bf16"
LAYOUT = "row_scale_v1"
_ENCODE_CHUNK_VALUES = 1 << 22


@dataclass(frozen=True)
class Fp8RowGeometry:
    rows: int
    columns: int
    scale_offset: int
    size: int


def pack_fp8_row(codes: np.ndarray, scales: np.ndarray) -> bytes:
    """Lay out E4M3FN code bytes ``[N, K]`` and BF16 scale words ``[N]`` as one object."""
    codes = np.asarray(codes)
    if codes.ndim != 2 or not np.issubdtype(codes.dtype, np.integer):
        raise codec_error(
            CODEC, f"codes must be a rank-2 integer array, got {codes.dtype} {codes.shape}"
        )
    geo = CODEC.geometry(codes.shape)
    scales = np.asarray(scales)
    if scales.shape != (geo.rows,) or not np.issubdtype(scales.dtype, np.integer):
        raise codec_error(
            CODEC,
            f"scales must be BF16 words of shape [{geo.rows}], "
            f"got {scales.dtype} {shape_text(scales.shape)}",
        )
    if codes.min() < 0 or codes.max() > 0xFF:
        raise codec_error(CODEC, "codes must be bytes in [0, 255]")
    if scales.min() < 0 or scales.max() > 0xFFFF:
        raise codec_error(CODEC, "scale words must lie in [0, 0xFFFF]")
    out = np.zeros(geo.size, dtype=np.uint8)
    out[: geo.rows * geo.columns] = codes.astype(np.uint8).reshape(-1)
    out[geo.scale_offset :] = scales.astype("<u2").view(np.uint8)
    return out.tobytes()


def unpack_fp8_row(data: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Code bytes ``[N, K]`` (uint8) and BF16 scale words ``[N]`` (uint16)."""
    geo = CODEC.geometry(shape)
    raw = as_object_bytes(CODEC, data, geo.size)
    return raw[: geo.rows * geo.columns].reshape(geo.rows, geo.columns).copy(), _scales(geo, raw)


def _scales(geo: Fp8RowGeometry, raw: np.ndarray) -> np.ndarray:
    return raw[geo.scale_offset :].view("<u2").astype(np.uint16)


def fp8_row_maxabs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Spec 3.4 / notes 2.4 reference encoder: code bytes ``[N, K]`` and BF16 scale words ``[N]``.

    Sources are rounded to float32 and then to BF16 first, as upstream does, so a float32
    checkpoint and its BF16 copy give the same bytes.
    """
    values = np.asarray(values)
    if not (np.issubdtype(values.dtype, np.floating) or np.issubdtype(values.dtype, np.integer)):
        raise codec_error(CODEC, f"cannot encode values of dtype {values.dtype}")
    with np.errstate(over="ignore"):
        x = values.astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise codec_error(CODEC, "cannot encode non-finite values (or values beyond float32)")
    geo = CODEC.geometry(x.shape)
    codes = np.empty(x.shape, dtype=np.uint8)
    scales = np.empty(geo.rows, dtype=np.uint16)
    step = max(1, _ENCODE_CHUNK_VALUES // geo.columns)
    for start in range(0, geo.rows, step):
        rows = slice(start, start + step)
        codes[rows], scales[rows] = _maxabs_rows(x[rows])
    return codes, scales


def _maxabs_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = bf16_to_f32(f32_to_bf16(x))
    amax = np.abs(x).max(axis=1)
    words = f32_to_bf16((amax.astype(np.float64) / E4M3FN_MAX).astype(np.float32))
    words[(words == 0) & (amax > 0)] = 0x0001  # underflow rescue: smallest BF16 subnormal
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        # Below 2^-128 the reciprocal overflows to Inf (as in the reference); zeros must then
        # stay zeros instead of becoming Inf * 0 = NaN. Otherwise this is exactly f32(x * inv).
        inv = np.where(words == 0, np.float32(0), np.float32(1) / bf16_to_f32(words))
        y = np.where(x == 0, x, x * inv[:, None])
    y = np.clip(y, np.float32(-E4M3FN_MAX), np.float32(E4M3FN_MAX))
    codes = f32_to_e4m3fn(y)
    codes[words == 0] = 0x00  # all-zero rows are +0 throughout, even for -0 inputs
    return codes, words


@dataclass(frozen=True)
class Fp8RowCodec:
    format: str = FORMAT
    layout: str = LAYOUT
    alignment: int = ALIGNMENT
    profile: Profile = "CORE"
    decoded_dtype: np.dtype = FLOAT32
    bits_per_weight: float = 8.0

    def geometry(self, shape: tuple[int, ...], divisors: int = 1) -> Fp8RowGeometry:
        check_single_divisor(self, divisors)
        n, k = check_dims(self, shape, rank=2)
        scale_offset = align_up(n * k, ALIGNMENT)
        return Fp8RowGeometry(
            rows=n, columns=k, scale_offset=scale_offset, size=scale_offset + 2 * n
        )

    def check_shape(self, shape: tuple[int, ...], divisors: int = 1) -> None:
        self.geometry(shape, divisors)

    def encoded_size(self, shape: tuple[int, ...], divisors: int = 1) -> int:
        return self.geometry(shape, divisors).size

    def decode(self, data: np.ndarray, shape: tuple[int, ...], divisors: int = 1) -> np.ndarray:
        """``w = f32(e4m3(c) * bf16(s))``: one table lookup, then one float32 multiply per row."""
        geo = self.geometry(shape, divisors)
        raw = as_object_bytes(self, data, geo.size)
        codes = raw[: geo.rows * geo.columns].reshape(geo.rows, geo.columns)
        values = np.take(E4M3FN_VALUES, codes)
        with np.errstate(all="ignore"):
            values *= bf16_to_f32(_scales(geo, raw))[:, None]
        return values

    def encode(self, values: np.ndarray, divisors: int = 1) -> bytes:
        check_single_divisor(self, divisors)
        return pack_fp8_row(*fp8_row_maxabs(values))

    def scan(self, data: np.ndarray, shape: tuple[int, ...], divisors: int = 1) -> list[Finding]:
        geo = self.geometry(shape, divisors)
        raw = as_object_bytes(self, data, geo.size)
        codes = raw[: geo.rows * geo.columns].reshape(geo.rows, geo.columns)
        scales = _scales(geo, raw)
        findings: list[Finding] = []
        nan_codes = ((codes & 0x7F) == 0x7F).sum(axis=1)
        if nan_codes.any():
            text = "NaN code 0x7F/0xFF: " + where_text(nan_codes, "codes")
            findings.append(Finding("error", text))
        negative = scales >= 0x8000
        if negative.any():
            findings.append(Finding("error", "negative row scale: " + where_text(negative)))
        non_finite = (scales & 0x7F80) == 0x7F80
        if non_finite.any():
            findings.append(Finding("error", "row scale is Inf or NaN: " + where_text(non_finite)))
        zero_rows = scales == 0
        if zero_rows.any():
            nonzero = ((codes[zero_rows] & 0x7F) != 0).sum(axis=1)
            counts = np.zeros(geo.rows, dtype=np.int64)
            counts[zero_rows] = nonzero
            if counts.any():
                text = "non-zero codes in rows whose scale is +0: " + where_text(counts, "codes")
                findings.append(Finding("error", text))
        findings += nonzero_gap_findings(
            raw, [(geo.rows * geo.columns, geo.scale_offset, "gap after the code plane")]
        )
        return findings


CODEC = register(Fp8RowCodec())
