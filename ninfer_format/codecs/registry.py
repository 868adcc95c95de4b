"""The registry of tensor codecs: one codec per (format, layout) pair.

A codec knows the byte geometry of its layout and the numbers of its format. Names are
resolved lazily (rule R13): opening an artifact never fails on an unknown name, interpreting
the object does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from ..errors import CodecError

Profile = Literal["CORE", "EXT-ALL", "ninfer"]


@dataclass(frozen=True)
class Finding:
    """One problem found by scanning an object's bytes (``ninfer-inspect --verify``)."""

    severity: Literal["error", "warning"]
    message: str


class TensorCodec(Protocol):
    format: str
    layout: str
    alignment: int
    profile: Profile
    #: numpy dtype of decoded values: float32, or int32 for the int32 format
    decoded_dtype: np.dtype
    #: logical bits per weight, for reports (0 when not meaningful)
    bits_per_weight: float

    def check_shape(self, shape: tuple[int, ...], divisors: int = 1) -> None:
        """Raise ``CodecError`` if the layout cannot hold a tensor of this shape."""

    def encoded_size(self, shape: tuple[int, ...], divisors: int = 1) -> int:
        """Exact ``bytes`` of an object of this shape (checks the shape first)."""

    def decode(self, data: np.ndarray, shape: tuple[int, ...], divisors: int = 1) -> np.ndarray:
        """``data`` is the object's uint8 bytes; returns values of ``shape``."""

    def encode(self, values: np.ndarray, divisors: int = 1) -> bytes:
        """Reference encoder from float (or int32) values to the object's bytes."""

    def scan(self, data: np.ndarray, shape: tuple[int, ...], divisors: int = 1) -> list[Finding]:
        """Invalid code words or scales (errors) and non-zero padding (warnings)."""


_CODECS: dict[tuple[str, str], TensorCodec] = {}
_LAYOUTS: set[str] = set()


def register(codec: TensorCodec) -> TensorCodec:
    key = (codec.format, codec.layout)
    if key in _CODECS:
        raise ValueError(f"codec {key} registered twice")
    _CODECS[key] = codec
    _LAYOUTS.add(codec.layout)
    return codec


def codec_for(format: str, layout: str) -> TensorCodec:
    """The codec for a (format, layout) pair, or a ``CodecError`` that says what is wrong."""
    codec = _CODECS.get((format, layout))
    if codec is not None:
        return codec
    formats = {f for f, _ in _CODECS}
    if format not in formats:
        raise CodecError(f"format {format!r} is not implemented")
    if layout not in _LAYOUTS:
        raise CodecError(f"layout {layout!r} is not implemented")
    allowed = sorted(lay for f, lay in _CODECS if f == format)
    raise CodecError(
        f"format {format!r} cannot be stored in layout {layout!r} (allowed: {allowed})"
    )


def all_codecs() -> list[TensorCodec]:
    return list(_CODECS.values())
