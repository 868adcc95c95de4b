"""``contiguous_le_v1``: bf16, fp32 and int32 words in C order, little-endian, nothing else.

The module also holds the small checks every codec in this package shares (shape words,
byte-count checks, finding summaries), so the error texts read the same for every layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import CodecError
from ..numeric import f32_to_bf16
from .registry import Finding, Profile, register

ALIGNMENT = 256
MAX_RANK = 16
FLOAT32 = np.dtype(np.float32)


# --- helpers shared by the codecs of this package --------------------------------------------


def shape_text(shape: Any) -> str:
    try:
        return "[" + ", ".join(str(int(d)) for d in shape) + "]"
    except (TypeError, ValueError):
        return repr(shape)


def codec_error(codec: Any, message: str) -> CodecError:
    """A ``CodecError`` that starts with ``format/layout`` so the reader knows whose rule failed."""
    return CodecError(f"{codec.format}/{codec.layout} {message}")


def check_dims(codec: Any, shape: Any, rank: int | None = None) -> tuple[int, ...]:
    """Shape words as positive Python ints; the directory schema allows nothing else."""
    try:
        dims = tuple(shape)
        if not all(isinstance(d, int | np.integer) and not isinstance(d, bool) for d in dims):
            raise TypeError
        dims = tuple(int(d) for d in dims)
    except (TypeError, ValueError):
        raise codec_error(codec, f"needs a shape of integers, got {shape!r}") from None
    if rank is not None and len(dims) != rank:
        raise codec_error(codec, f"needs rank {rank}, got shape {shape_text(dims)}")
    if len(dims) > MAX_RANK:
        raise codec_error(codec, f"needs rank <= {MAX_RANK}, got rank {len(dims)}")
    if any(d <= 0 for d in dims):
        raise codec_error(codec, f"needs every dimension > 0, got shape {shape_text(dims)}")
    return dims


def check_single_divisor(codec: Any, divisors: Any) -> None:
    if isinstance(divisors, bool) or divisors != 1:
        raise codec_error(codec, f"takes no divisors (only nvfp4 does), got divisors={divisors!r}")


def as_object_bytes(codec: Any, data: Any, expected: int) -> np.ndarray:
    """The object's bytes as a 1-D contiguous uint8 array of exactly ``expected`` bytes."""
    if isinstance(data, bytes | bytearray | memoryview):
        data = np.frombuffer(data, dtype=np.uint8)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 1:
        kind = (
            f"{data.dtype} array of rank {data.ndim}"
            if isinstance(data, np.ndarray)
            else type(data).__name__
        )
        raise codec_error(codec, f"needs the object's bytes as a 1-D uint8 array, got {kind}")
    if data.size != expected:
        raise codec_error(codec, f"object must be {expected} bytes, got {data.size}")
    return np.ascontiguousarray(data)


def where_text(counts: np.ndarray, unit: str | None = None, limit: int = 4) -> str:
    """Where a finding occurs, from a per-row ``[N]`` or per-group ``[N, groups]`` array.

    With ``unit`` the array holds counts ("17 lanes in 3 groups: row 0 group 1 (5), ...");
    without, it is a mask ("3 groups: row 0 group 1, ..."). Scans can find millions of bad
    words; one line per kind of finding with the first few places is what a person can use.
    """
    counts = np.asarray(counts)
    places = np.flatnonzero(counts)
    if counts.ndim == 1:
        scope = "rows"
        names = [f"row {int(p)}" for p in places[:limit]]
    else:
        scope = "groups"
        width = counts.shape[-1]
        names = [f"row {int(p) // width} group {int(p) % width}" for p in places[:limit]]
    if unit is not None:
        names = [f"{name} ({int(counts.flat[p])})" for name, p in zip(names, places, strict=False)]
        head = f"{int(counts.sum())} {unit} in {len(places)} {scope}"
    else:
        head = f"{len(places)} {scope}"
    more = f", and {len(places) - limit} more" if len(places) > limit else ""
    return f"{head}: {', '.join(names)}{more}"


def nonzero_gap_findings(data: np.ndarray, gaps: list[tuple[int, int, str]]) -> list[Finding]:
    """Warnings for non-zero bytes in the zero-filled stretches between planes (decision 3)."""
    findings = []
    for start, stop, name in gaps:
        count = int(np.count_nonzero(data[start:stop]))
        if count:
            findings.append(
                Finding(
                    "warning", f"non-zero padding: {count} bytes in the {name} [{start}, {stop})"
                )
            )
    return findings


# --- the codec --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContiguousCodec:
    """One word per element; every word is valid, so decoding is a reinterpretation."""

    format: str
    word: str  # little-endian unsigned numpy type code of one word
    decoded_dtype: np.dtype
    layout: str = "contiguous_le_v1"
    alignment: int = ALIGNMENT
    profile: Profile = "CORE"
    bits_per_weight: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bits_per_weight", float(np.dtype(self.word).itemsize * 8))

    def _dims(self, shape: tuple[int, ...], divisors: int) -> tuple[int, ...]:
        check_single_divisor(self, divisors)
        try:
            dims = tuple(shape)
        except TypeError:
            raise codec_error(self, f"needs a shape of integers, got {shape!r}") from None
        return check_dims(self, dims) if dims else ()

    def check_shape(self, shape: tuple[int, ...], divisors: int = 1) -> None:
        self._dims(shape, divisors)

    def encoded_size(self, shape: tuple[int, ...], divisors: int = 1) -> int:
        return math.prod(self._dims(shape, divisors)) * np.dtype(self.word).itemsize

    def decode(self, data: np.ndarray, shape: tuple[int, ...], divisors: int = 1) -> np.ndarray:
        dims = self._dims(shape, divisors)
        raw = as_object_bytes(self, data, self.encoded_size(dims))
        # Through unsigned integers: a float cast could touch NaN payloads; this cannot.
        words = raw.view(self.word).astype(self.word[1:])
        if self.format == "bf16":
            words = words.astype(np.uint32) << np.uint32(16)
        return words.view(self.decoded_dtype).reshape(dims)

    def encode(self, values: np.ndarray, divisors: int = 1) -> bytes:
        values = np.asarray(values)
        dims = self._dims(values.shape, divisors)
        if self.format == "int32":
            words = _to_int32(self, values).view(np.uint32)
        else:
            if not (np.issubdtype(values.dtype, np.number) or values.dtype == np.bool_):
                raise codec_error(self, f"cannot encode values of dtype {values.dtype}")
            if np.iscomplexobj(values):
                raise codec_error(self, "cannot encode complex values")
            f32 = values.astype(np.float32)  # RNE for float64; exact for float16/float32
            words = f32_to_bf16(f32) if self.format == "bf16" else f32.view(np.uint32)
        return np.ascontiguousarray(words.reshape(dims)).astype(self.word).tobytes()

    def scan(self, data: np.ndarray, shape: tuple[int, ...], divisors: int = 1) -> list[Finding]:
        as_object_bytes(self, data, self.encoded_size(shape, divisors))
        return []  # every bf16, fp32 and int32 word is valid; there is no padding


def _to_int32(codec: ContiguousCodec, values: np.ndarray) -> np.ndarray:
    """Integers must fit; floats must be whole numbers (no silent truncation)."""
    if values.dtype == np.bool_ or np.issubdtype(values.dtype, np.integer):
        if values.size and (values.min() < -(2**31) or values.max() > 2**31 - 1):
            raise codec_error(codec, "values outside the int32 range")
        return values.astype(np.int32)
    if not np.issubdtype(values.dtype, np.floating):
        raise codec_error(codec, f"cannot encode values of dtype {values.dtype}")
    if not np.all(np.isfinite(values)):
        raise codec_error(codec, "cannot encode non-finite values as int32")
    if np.any(np.trunc(values) != values):
        raise codec_error(codec, "cannot encode non-integer values as int32")
    if values.size and (values.min() < -(2**31) or values.max() > 2**31 - 1):
        raise codec_error(codec, "values outside the int32 range")
    return values.astype(np.int32)


BF16 = register(ContiguousCodec("bf16", "<u2", FLOAT32))
FP32 = register(ContiguousCodec("fp32", "<u4", FLOAT32))
INT32 = register(ContiguousCodec("int32", "<u4", np.dtype(np.int32)))
