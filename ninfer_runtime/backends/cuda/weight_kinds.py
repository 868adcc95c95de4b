"""What the device's weights are made of: resident parents (an object's or a cut's stored
bytes on the device, with the planes its kernels read), row segments of them, and the two
kinds of weight built from those (``weights.Residency`` makes them; the products, the expert
tables and the streamed experts read them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .formats import Planes

__all__ = ["DenseWeight", "PackedWeight", "Parent", "Segment"]


@dataclass
class Parent:
    """A resident object: its stored bytes on the device and the planes the kernels read."""

    object_id: str
    data: Any  # uint8 device array, the object's bytes verbatim
    planes: Planes


@dataclass(frozen=True)
class Segment:
    """Rows ``row0 .. row0 + rows - 1`` of a parent, in the parameter's row order."""

    parent: Parent
    row0: int
    rows: int


@dataclass
class PackedWeight:
    segments: list[Segment]
    shape: tuple[int, int]
    #: int device array when the input columns are stored out of order (GGUF imports):
    #: stored column c multiplies input element ``input_columns[c]``
    input_columns: Any = field(default=None, repr=False)
    dense: Any = field(default=None, repr=False)  # float32 copy, made only if asked for

    @property
    def columns(self) -> int:
        return self.shape[1]


@dataclass
class DenseWeight:
    array: Any  # float32 device array

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)
