"""The bytes of one synthetic object: random codes and scales of its format, in chunks of a
few MB, so a full-size artifact is generated with bounded memory at near disk speed.

Value distributions (so a forward pass stays finite and activations keep their scale):

- matrices decode to values of standard deviation ~ 1/sqrt(K) (K = input width): random code
  bytes, and scale words (binary16 / E4M3FN / BF16) chosen from the code distribution's RMS;
- zero-centred norms (RMSNorm_1p: gain ``1 + w``) get ``w`` ~ 0 (gain ~ 1); the GDN output
  norm (plain gain) ~ 1; the GDN convolution ~ N(0, 1/sqrt(T));
- the vision tower's LayerNorm gains ~ 1, its biases ~ 0;
- ``gdn/a_log`` = log U(1, 16), ``gdn/dt_bias`` ~ N(0, 0.5), both fp32.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import numpy as np

from ninfer_convert.plan import Parent
from ninfer_format.codecs import codec_for
from ninfer_format.codecs.gguf_blocks import FORMAT_BLOCKS, set_scales
from ninfer_format.codecs.gguf_blocks import LAYOUT as GGUF_LAYOUT
from ninfer_format.codecs.nvfp4 import CODEC as NVFP4_CODEC
from ninfer_format.codecs.row_split import FORMATS as ROW_SPLIT_FORMATS
from ninfer_format.codecs.row_split import row_split_geometry
from ninfer_format.numeric import E2M1_VALUES, E4M3FN_VALUES, NF4_CODEBOOK, NF4_ZERO_CODE

#: bytes per ``write`` call (and per generated temporary)
CHUNK_BYTES = 4 << 20


def _random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.frombuffer(rng.bytes(n), dtype=np.uint8).copy()


def _row_chunks(rows: int, row_bytes: int) -> Iterator[tuple[int, int]]:
    step = max(1, CHUNK_BYTES // max(row_bytes, 1))
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


def _zeros(n: int) -> Iterator[bytes]:
    while n > 0:
        step = min(n, CHUNK_BYTES)
        yield bytes(step)
        n -= step


def _lane_mask(columns: int, padded: int, bits: int) -> np.ndarray:
    """Per-row byte mask of a plane holding ``bits`` per lane: 1 bits on real columns."""
    valid = np.arange(padded) < columns
    return np.packbits(np.repeat(valid, bits), bitorder="little")


def _code_rms(format: str) -> float:
    spec = ROW_SPLIT_FORMATS[format]
    if spec.nf4:
        return float(np.sqrt(np.mean(NF4_CODEBOOK.astype(np.float64) ** 2)))
    levels = np.arange(-(1 << (spec.bits - 1)), 1 << (spec.bits - 1), dtype=np.float64)
    if spec.bits == 8:
        levels[0] = 0  # -128 is illegal: drawn as 0
    return float(np.sqrt(np.mean(levels**2)))


def _f16_scales(rng: np.random.Generator, shape: tuple[int, ...], target: float) -> np.ndarray:
    """Positive normal binary16 words near ``target`` (mantissa jitter of about +-6%)."""
    base = int(np.float16(target).view(np.uint16))
    jitter = rng.integers(-64, 65, size=shape, dtype=np.int32)
    return (base + jitter).astype("<u2")


def _row_split(parent: Parent, rng: np.random.Generator) -> Iterator[bytes | np.ndarray]:
    fmt = ROW_SPLIT_FORMATS[parent.choice.format]
    rows, columns = parent.shape
    geo = row_split_geometry(fmt.name, (rows, columns))
    padded = geo.columns < geo.padded_columns
    base_bits = 8 if fmt.bits == 8 else 4
    base_row = geo.base_bytes // rows
    mask = _lane_mask(columns, geo.padded_columns, base_bits)
    fill = (~mask & (NF4_ZERO_CODE * 0x11 if fmt.nf4 else 0)).astype(np.uint8)
    for a, b in _row_chunks(rows, base_row):
        chunk = _random_bytes(rng, (b - a) * base_row).reshape(b - a, base_row)
        if fmt.bits == 8:
            chunk[chunk == 0x80] = 0
        if padded:
            chunk &= mask
            chunk |= fill
        yield chunk
    yield from _zeros(geo.high_offset - geo.base_bytes)
    if geo.high_bytes:
        high_row = geo.high_bytes // rows
        high_mask = _lane_mask(columns, geo.padded_columns, fmt.bits - 4)
        for a, b in _row_chunks(rows, high_row):
            chunk = _random_bytes(rng, (b - a) * high_row).reshape(b - a, high_row)
            if padded:
                chunk &= high_mask
            yield chunk
    yield from _zeros(geo.scale_offset - geo.high_offset - geo.high_bytes)
    target = 1.0 / (math.sqrt(columns) * _code_rms(fmt.name))
    for a, b in _row_chunks(rows, 2 * geo.groups_per_row):
        words = np.zeros((b - a, geo.groups_per_row), dtype="<u2")
        words[:, : geo.real_groups] = _f16_scales(rng, (b - a, geo.real_groups), target)
        yield words


#: E4M3FN block scales drawn from [8, 16): bytes 0x50..0x57 (exponent 3, any mantissa)
_NVFP4_SCALE_BYTES = np.arange(0x50, 0x58, dtype=np.uint8)


def nvfp4_divisor(columns: int) -> float:
    """The weight divisor that makes random codes and scales decode with std ~ 1/sqrt(K)."""
    e2m1_rms = float(np.sqrt(np.mean(E2M1_VALUES.astype(np.float64) ** 2)))
    scales = E4M3FN_VALUES[_NVFP4_SCALE_BYTES].astype(np.float64)
    return e2m1_rms * float(np.sqrt(np.mean(scales**2))) * math.sqrt(columns)


def _nvfp4(parent: Parent, rng: np.random.Generator) -> Iterator[bytes | np.ndarray]:
    geo = NVFP4_CODEC.geometry(parent.shape, parent.divisors or 1)
    for start in range(0, geo.code_bytes, CHUNK_BYTES):
        yield _random_bytes(rng, min(CHUNK_BYTES, geo.code_bytes - start))
    yield from _zeros(geo.scale_offset - geo.code_bytes)
    for start in range(0, geo.scale_bytes, CHUNK_BYTES):
        n = min(CHUNK_BYTES, geo.scale_bytes - start)
        yield _random_bytes(rng, n) % np.uint8(8) + np.uint8(0x50)
    divisor = np.float32(nvfp4_divisor(geo.columns))
    yield np.full(geo.divisors, divisor, dtype="<f4")


def _fp8_row(parent: Parent, rng: np.random.Generator) -> Iterator[bytes | np.ndarray]:
    rows, columns = parent.shape
    finite = E4M3FN_VALUES[np.isfinite(E4M3FN_VALUES)].astype(np.float64)
    rms = float(np.sqrt(np.mean(finite**2)))
    for a, b in _row_chunks(rows, columns):
        chunk = _random_bytes(rng, (b - a) * columns)
        chunk[(chunk & 0x7F) == 0x7F] -= 1  # NaN codes -> the largest finite magnitude
        yield chunk
    yield from _zeros((-(rows * columns)) % 256)
    target = np.float32(1.0 / (math.sqrt(columns) * rms))
    base = int(target.view(np.uint32) >> 16)
    yield (base + rng.integers(-8, 9, size=rows, dtype=np.int32)).astype("<u2")


@functools.cache
def _gguf_scale(fmt: str) -> float:
    """The RMS of the values of random ``fmt`` blocks whose scale fields are all 1.0 (values
    are linear in d and dmin together, so this sets the scale for any target)."""
    _, values_per_block, block_bytes = FORMAT_BLOCKS[fmt]
    blocks = _random_bytes(np.random.default_rng(0), 64 * block_bytes).reshape(64, block_bytes)
    set_scales(fmt, blocks, np.full(64, 0x3C00, dtype=np.uint16))
    values = codec_for(fmt, GGUF_LAYOUT).decode(blocks.reshape(-1), (64, values_per_block))
    return float(np.sqrt(np.mean(values.astype(np.float64) ** 2)))


def _gguf(parent: Parent, rng: np.random.Generator) -> Iterator[bytes | np.ndarray]:
    """Random ggml blocks whose scale fields make the values' std ~ 1/sqrt(K)."""
    fmt = parent.choice.format
    _, values, block_bytes = FORMAT_BLOCKS[fmt]
    columns = parent.shape[-1]
    rows = math.prod(parent.shape[:-1])
    row_bytes = columns // values * block_bytes
    target = 1.0 / (math.sqrt(columns) * _gguf_scale(fmt))
    for a, b in _row_chunks(rows, row_bytes):
        blocks = _random_bytes(rng, (b - a) * row_bytes).reshape(-1, block_bytes)
        set_scales(fmt, blocks, _f16_scales(rng, (blocks.shape[0],), target))
        yield blocks


def _bf16_words(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 words by rounding to nearest (values are finite)."""
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


#: the vision tower's LayerNorm gains (blocks and merger), which multiply by ``w`` itself
_LAYER_NORM_GAINS = ("norm1_weight", "norm2_weight", "norm_weight")


def _vector_values(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if name.endswith("gdn/a_log"):
        return np.log(rng.uniform(1.0, 16.0, size=shape))
    if name.endswith("gdn/dt_bias"):
        return rng.normal(0.0, 0.5, size=shape)
    if name.endswith("gdn/norm"):  # plain gain
        return 1.0 + 0.05 * rng.standard_normal(shape)
    if name.startswith("vision/") and name.endswith(_LAYER_NORM_GAINS):  # plain gains
        return 1.0 + 0.05 * rng.standard_normal(shape)
    if name.endswith("gdn/convolution"):
        return rng.normal(0.0, 1.0 / math.sqrt(shape[0]), size=shape)
    return 0.05 * rng.standard_normal(shape)  # zero-centred norms: gain 1 + w ~ 1


def _direct(parent: Parent, rng: np.random.Generator) -> Iterator[bytes | np.ndarray]:
    fmt = parent.choice.format
    for member in parent.stacked:
        if member.role == "matrix":
            rows, columns = member.shape
            for a, b in _row_chunks(rows, 4 * columns):
                x = rng.standard_normal((b - a, columns), dtype=np.float32)
                x *= np.float32(1.0 / math.sqrt(columns))
                yield _bf16_words(x) if fmt == "bf16" else x.astype("<f4")
            continue
        if fmt == "int32":  # the proposal's token ids
            yield np.asarray(member.constant or np.zeros(member.shape), dtype="<i4")
            continue
        values = _vector_values(member.name, member.shape, rng).astype(np.float32)
        yield _bf16_words(values) if fmt == "bf16" else values.astype("<f4")


def parent_chunks(parent: Parent, seed: int) -> Iterator[bytes | np.ndarray]:
    """The parent's object bytes, in chunks of at most about ``CHUNK_BYTES``."""
    rng = np.random.default_rng([seed, int(parent.id.rsplit("/", 1)[1])])
    fmt = parent.choice.format
    if fmt in ROW_SPLIT_FORMATS:
        return _row_split(parent, rng)
    if fmt == "nvfp4":
        return _nvfp4(parent, rng)
    if fmt == "fp8_e4m3fn_row_bf16":
        return _fp8_row(parent, rng)
    if fmt in ("bf16", "fp32", "int32"):
        return _direct(parent, rng)
    if fmt in FORMAT_BLOCKS:
        return _gguf(parent, rng)
    raise ValueError(f"{parent.id}: synthetic {fmt} objects are not supported")
