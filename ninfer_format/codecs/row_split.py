"""``row_split_k128_v1``: grouped integer codes in planes (base nibbles/bytes, high bits, scales).

Formats: q4/q5/q6 (G = 64), q8 (G = 32), all CORE, and the project's ``nf4_g64_fp16``
(decision 4: q4's byte geometry, the nibble indexes the NF4 codebook). Rows are padded to a
multiple of 128 columns so the GPU kernels can read whole 128-column tiles; the padding is part
of the object and must be zero (NF4: code 7, the zero level).

This module is the codec and the by-name entry points; the format table and plane geometry
(``row_split_formats``), the lanes (``row_split_lanes``), the reference encoder
(``row_split_encode``) and the scan (``row_split_scan``) live beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CodecError
from .direct import (
    ALIGNMENT,
    FLOAT32,
    as_object_bytes,
    check_dims,
    check_single_divisor,
    codec_error,
    shape_text,
)
from .registry import Finding, Profile, register
from .row_split_encode import absmax_codes
from .row_split_formats import (
    FORMATS,
    LAYOUT,
    ROW_TILE,
    RowSplitFormat,
    RowSplitGeometry,
    plane_geometry,
)
from .row_split_lanes import decode_values, pack_planes, unpack_planes
from .row_split_scan import scan_planes

__all__ = [
    "CODECS",
    "FORMATS",
    "LAYOUT",
    "ROW_TILE",
    "RowSplitCodec",
    "RowSplitFormat",
    "RowSplitGeometry",
    "grouped_absmax",
    "pack_row_split",
    "row_split_geometry",
    "unpack_row_split",
]


def row_split_geometry(format: str, shape: tuple[int, int]) -> RowSplitGeometry:
    """Plane offsets for ``format`` at ``shape`` (also what the GPU loader slices by)."""
    codec = _codec(format)
    return codec.geometry(shape)


def _codec(format: str) -> RowSplitCodec:
    codec = CODECS.get(format)
    if codec is None:
        raise CodecError(f"format {format!r} has no {LAYOUT} codec (known: {sorted(CODECS)})")
    return codec


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
    return pack_planes(fmt, geo, codes, scales)


def unpack_row_split(
    format: str, data: np.ndarray, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Codes ``[N, K]`` (int8; nf4: uint8 indices) and scale words ``[N, ceil(K/G)]`` (uint16).

    Inverse of ``pack_row_split``; padding is dropped (``scan`` reports it).
    """
    codec = _codec(format)
    geo = codec.geometry(shape)
    raw = as_object_bytes(codec, data, geo.size)
    return unpack_planes(codec.spec, geo, raw)


def grouped_absmax(
    format: str, values: np.ndarray, divisors: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Spec 3.2 ``grouped_absmax`` (nf4: absmax scale, nearest level): codes and scale words.

    Returns what ``pack_row_split`` takes, so scale-search methods can reuse the code rule.
    """
    return absmax_codes(_codec(format), values, divisors)


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
        return plane_geometry(self.spec, n, k)

    def check_shape(self, shape: tuple[int, ...], divisors: int = 1) -> None:
        self.geometry(shape, divisors)

    def encoded_size(self, shape: tuple[int, ...], divisors: int = 1) -> int:
        return self.geometry(shape, divisors).size

    def decode(self, data: np.ndarray, shape: tuple[int, ...], divisors: int = 1) -> np.ndarray:
        """``w = f32(scale) * code``, a signed product: EXT-ALL negative scales decode too."""
        geo = self.geometry(shape, divisors)
        raw = as_object_bytes(self, data, geo.size)
        return decode_values(self.spec, geo, raw)

    def encode(self, values: np.ndarray, divisors: int = 1) -> bytes:
        codes, scales = grouped_absmax(self.format, values, divisors)
        return pack_row_split(self.format, codes, scales)

    def scan(self, data: np.ndarray, shape: tuple[int, ...], divisors: int = 1) -> list[Finding]:
        geo = self.geometry(shape, divisors)
        raw = as_object_bytes(self, data, geo.size)
        return scan_planes(self.spec, geo, raw)


CODECS: dict[str, RowSplitCodec] = {name: RowSplitCodec(spec) for name, spec in FORMATS.items()}
for _codec_object in CODECS.values():
    register(_codec_object)
