"""``block_scale_k16_m128x4_v1``: NVFP4 codes, swizzled E4M3FN block scales, FP32 divisors.

The scale plane is stored in the 128x4 tile order that Blackwell's block-scaled MMA reads, so
the GPU loads it without a transpose; everything on the host works on the natural ``[N, K/16]``
order and converts with a reshape/transpose (``swizzle_offsets`` states the map explicitly).

EXT-ALL ``divisors``: an object may stack ``divisors`` independently quantized matrices along
N, each with its own FP32 weight divisor (row ``n`` uses ``d_w[n // (N / divisors)]``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..framing import align_up
from ..numeric import (
    E2M1_VALUES,
    E4M3FN_MAX,
    E4M3FN_VALUES,
    e4m3fn_to_f32,
    f32_to_e2m1,
    f32_to_e4m3fn,
)
from .direct import (
    ALIGNMENT,
    FLOAT32,
    as_object_bytes,
    check_dims,
    codec_error,
    nonzero_gap_findings,
    shape_text,
    where_text,
)
from .registry import Finding, Profile, register

FORMAT = "nvfp4"
LAYOUT = "block_scale_k16_m128x4_v1"
BLOCK = 16  # values per E4M3FN scale, along K
TILE_ROWS = 128
TILE_COLUMNS = 64  # four scale blocks
# nvfp4_absmax: amax maps to 6 (largest E2M1) * 448 (largest E4M3FN)
_RANGE = np.float32(6 * E4M3FN_MAX)
_ENCODE_CHUNK_ROWS = 1024


@dataclass(frozen=True)
class Nvfp4Geometry:
    rows: int
    columns: int
    divisors: int
    code_bytes: int
    scale_offset: int
    scale_bytes: int
    divisor_offset: int
    size: int

    @property
    def rows_per_divisor(self) -> int:
        return self.rows // self.divisors


def swizzle_offsets(rows: int, columns: int) -> np.ndarray:
    """Byte offset, relative to the scale plane, of the scale of block ``(n, g)``: ``[N, K/16]``."""
    n = np.arange(rows, dtype=np.int64)[:, None]
    g = np.arange(columns // BLOCK, dtype=np.int64)[None, :]
    row_tile, ri = n // TILE_ROWS, n % TILE_ROWS
    tile = row_tile * (columns // TILE_COLUMNS) + g // 4
    return tile * 512 + (ri % 32) * 16 + (ri // 32) * 4 + g % 4


def _swizzle(natural: np.ndarray) -> np.ndarray:
    """Natural ``[N, K/16]`` scales -> the stored plane (flat)."""
    rows, blocks = natural.shape
    tiled = natural.reshape(rows // TILE_ROWS, 4, 32, blocks // 4, 4)
    return tiled.transpose(0, 3, 2, 1, 4).reshape(-1)


def _unswizzle(plane: np.ndarray, rows: int, columns: int) -> np.ndarray:
    """The stored plane -> natural ``[N, K/16]`` scales (the permutation is its own inverse)."""
    tiled = plane.reshape(rows // TILE_ROWS, columns // TILE_COLUMNS, 32, 4, 4)
    return tiled.transpose(0, 3, 2, 1, 4).reshape(rows, columns // BLOCK)


# --- pack / unpack ----------------------------------------------------------------------------


def pack_nvfp4(codes: np.ndarray, scales: np.ndarray, divisors: np.ndarray) -> bytes:
    """Lay out E2M1 nibbles ``[N, K]``, E4M3FN scale bytes ``[N, K/16]`` (natural order) and
    the FP32 weight divisors ``[d]`` as one object. Divisor bits are kept exactly.
    """
    codes = np.asarray(codes)
    divs = np.atleast_1d(np.asarray(divisors))
    if divs.ndim != 1 or not np.issubdtype(divs.dtype, np.floating):
        raise codec_error(
            CODEC, f"divisors must be a 1-D float array, got {divs.dtype} {divs.shape}"
        )
    if codes.ndim != 2 or not np.issubdtype(codes.dtype, np.integer):
        raise codec_error(
            CODEC, f"codes must be a rank-2 integer array, got {codes.dtype} {codes.shape}"
        )
    geo = CODEC.geometry(codes.shape, len(divs))
    scales = np.asarray(scales)
    blocks = (geo.rows, geo.columns // BLOCK)
    if scales.shape != blocks or not np.issubdtype(scales.dtype, np.integer):
        raise codec_error(
            CODEC,
            f"scales must be E4M3FN bytes of shape {shape_text(blocks)}, "
            f"got {scales.dtype} {shape_text(scales.shape)}",
        )
    if codes.size and (codes.min() < 0 or codes.max() > 0xF):
        raise codec_error(CODEC, "codes must be nibbles in [0, 15]")
    if scales.size and (scales.min() < 0 or scales.max() > 0xFF):
        raise codec_error(CODEC, "scales must be bytes in [0, 255]")

    out = np.zeros(geo.size, dtype=np.uint8)
    pairs = codes.astype(np.uint8).reshape(-1, 2)
    out[: geo.code_bytes] = pairs[:, 0] | (pairs[:, 1] << 4)
    out[geo.scale_offset : geo.divisor_offset] = _swizzle(scales.astype(np.uint8))
    words = divs.astype(np.float32).view(np.uint32).astype("<u4")
    out[geo.divisor_offset :] = words.view(np.uint8)
    return out.tobytes()


def unpack_nvfp4(
    data: np.ndarray, shape: tuple[int, int], divisors: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nibbles ``[N, K]`` (uint8), natural-order scale bytes ``[N, K/16]``, divisors ``[d]``."""
    geo = CODEC.geometry(shape, divisors)
    raw = as_object_bytes(CODEC, data, geo.size)
    codes = np.stack([raw[: geo.code_bytes] & 0xF, raw[: geo.code_bytes] >> 4], axis=1)
    scales = _unswizzle(raw[geo.scale_offset : geo.divisor_offset], geo.rows, geo.columns)
    return codes.reshape(geo.rows, geo.columns), np.ascontiguousarray(scales), _divisors(geo, raw)


def _divisors(geo: Nvfp4Geometry, raw: np.ndarray) -> np.ndarray:
    return raw[geo.divisor_offset :].view("<u4").astype(np.uint32).view(np.float32)


# --- reference encoder ------------------------------------------------------------------------


def nvfp4_absmax(
    values: np.ndarray, divisors: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Notes 2.5 ``nvfp4_absmax``: codes, natural scales and one divisor per stacked matrix."""
    values = np.asarray(values)
    if not (np.issubdtype(values.dtype, np.floating) or np.issubdtype(values.dtype, np.integer)):
        raise codec_error(CODEC, f"cannot encode values of dtype {values.dtype}")
    with np.errstate(over="ignore"):
        x = values.astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise codec_error(CODEC, "cannot encode non-finite values (or values beyond float32)")
    geo = CODEC.geometry(x.shape, divisors)
    codes = np.empty(x.shape, dtype=np.uint8)
    scales = np.empty((geo.rows, geo.columns // BLOCK), dtype=np.uint8)
    divs = np.empty(geo.divisors, dtype=np.float32)
    per = geo.rows_per_divisor
    for i in range(geo.divisors):
        amax = np.abs(x[i * per : (i + 1) * per]).max()
        with np.errstate(divide="ignore", over="ignore"):
            divs[i] = np.float32(1) if amax == 0 else _RANGE / amax
        if not (np.isfinite(divs[i]) and divs[i] > 0):
            raise codec_error(CODEC, f"matrix {i}: absmax {amax} gives no finite weight divisor")
        for start in range(i * per, (i + 1) * per, _ENCODE_CHUNK_ROWS):
            rows = slice(start, min(start + _ENCODE_CHUNK_ROWS, (i + 1) * per))
            codes[rows], scales[rows] = _absmax_blocks(x[rows], divs[i])
    return codes, scales, divs


def _absmax_blocks(x: np.ndarray, divisor: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """All arithmetic in float32, in the reference's order (multiply by d_w, then divide)."""
    blocks = x.reshape(x.shape[0], -1, BLOCK)
    block_amax = np.abs(blocks).max(axis=2)
    raw = np.minimum(block_amax * divisor / np.float32(6), np.float32(E4M3FN_MAX))
    scales = f32_to_e4m3fn(raw)
    scales[(scales == 0) & (block_amax > 0)] = 0x01
    scale_values = e4m3fn_to_f32(scales)[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(scale_values == 0, np.float32(0), (blocks * divisor) / scale_values)
    return f32_to_e2m1(y).reshape(x.shape), scales


# --- the codec --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Nvfp4Codec:
    format: str = FORMAT
    layout: str = LAYOUT
    alignment: int = ALIGNMENT
    profile: Profile = "CORE"
    decoded_dtype: np.dtype = FLOAT32
    bits_per_weight: float = 4.5

    def geometry(self, shape: tuple[int, ...], divisors: int = 1) -> Nvfp4Geometry:
        if isinstance(divisors, bool) or not isinstance(divisors, int | np.integer) or divisors < 1:
            raise codec_error(self, f"needs a divisors count >= 1, got {divisors!r}")
        divisors = int(divisors)
        n, k = check_dims(self, shape, rank=2)
        if n % TILE_ROWS:
            raise codec_error(self, f"needs N % 128 == 0, got shape {shape_text(shape)}")
        if k % TILE_COLUMNS:
            raise codec_error(self, f"needs K % 64 == 0, got shape {shape_text(shape)}")
        if n % divisors or (divisors > 1 and (n // divisors) % TILE_ROWS):
            raise codec_error(
                self,
                f"needs N % divisors == 0 and (N / divisors) % 128 == 0, "
                f"got shape {shape_text(shape)} with divisors={divisors}",
            )
        code_bytes = n * k // 2
        scale_offset = align_up(code_bytes, ALIGNMENT)
        scale_bytes = n * k // BLOCK
        divisor_offset = scale_offset + scale_bytes
        return Nvfp4Geometry(
            rows=n,
            columns=k,
            divisors=divisors,
            code_bytes=code_bytes,
            scale_offset=scale_offset,
            scale_bytes=scale_bytes,
            divisor_offset=divisor_offset,
            size=divisor_offset + 4 * divisors,
        )

    def check_shape(self, shape: tuple[int, ...], divisors: int = 1) -> None:
        self.geometry(shape, divisors)

    def encoded_size(self, shape: tuple[int, ...], divisors: int = 1) -> int:
        return self.geometry(shape, divisors).size

    def decode(self, data: np.ndarray, shape: tuple[int, ...], divisors: int = 1) -> np.ndarray:
        """``e2m1(c) * e4m3(s) / d_w`` through one lookup per code byte.

        The product of an E2M1 and an E4M3FN value is exact in float32, so a table indexed by
        (scale byte, code byte) and already divided by ``d_w`` gives the same bits as doing the
        two operations per element, at a third of the memory traffic.
        """
        geo = self.geometry(shape, divisors)
        raw = as_object_bytes(self, data, geo.size)
        codes = raw[: geo.code_bytes].reshape(geo.rows, geo.columns // BLOCK, BLOCK // 2)
        scales = _unswizzle(raw[geo.scale_offset : geo.divisor_offset], geo.rows, geo.columns)
        out = np.empty((geo.rows, geo.columns // 2, 2), dtype=np.float32)
        per = geo.rows_per_divisor
        for i, divisor in enumerate(_divisors(geo, raw)):
            rows = slice(i * per, (i + 1) * per)
            table = _value_table(divisor)
            index = (scales[rows, :, None].astype(np.uint16) << 8) | codes[rows]
            out[rows] = np.take(table, index, axis=0).reshape(per, -1, 2)
        return out.reshape(geo.rows, geo.columns)

    def encode(self, values: np.ndarray, divisors: int = 1) -> bytes:
        return pack_nvfp4(*nvfp4_absmax(values, divisors))

    def scan(self, data: np.ndarray, shape: tuple[int, ...], divisors: int = 1) -> list[Finding]:
        geo = self.geometry(shape, divisors)
        raw = as_object_bytes(self, data, geo.size)
        findings: list[Finding] = []
        scales = _unswizzle(raw[geo.scale_offset : geo.divisor_offset], geo.rows, geo.columns)
        negative = scales >= 0x80
        if negative.any():
            text = "block scale has its sign bit set: " + where_text(negative)
            findings.append(Finding("error", text))
        nan = scales == 0x7F
        if nan.any():
            findings.append(Finding("error", "block scale is NaN (0x7F): " + where_text(nan)))
        for i, divisor in enumerate(_divisors(geo, raw)):
            if not (np.isfinite(divisor) and divisor > 0):
                text = f"weight divisor {i} is {divisor!r}; it must be finite and > 0"
                findings.append(Finding("error", text))
        findings += nonzero_gap_findings(
            raw, [(geo.code_bytes, geo.scale_offset, "gap after the code plane")]
        )
        return findings


_PAIR_VALUES = np.stack(
    [E2M1_VALUES[np.arange(256) & 0xF], E2M1_VALUES[np.arange(256) >> 4]], axis=1
)


def _value_table(divisor: np.float32) -> np.ndarray:
    """``[scale byte << 8 | code byte] -> two float32 values`` for one weight divisor."""
    with np.errstate(all="ignore"):  # NaN scales and invalid divisors decode as IEEE says
        table = (_PAIR_VALUES[None, :, :] * E4M3FN_VALUES[:, None, None]) / divisor
    return table.reshape(256 * 256, 2)


CODEC = register(Nvfp4Codec())
