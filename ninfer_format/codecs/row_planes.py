"""Where each row of a stored ``[N, K]`` object lies, for layouts that keep whole rows in order:
a reader that needs a few rows of a large table (hashed embeddings) reads only their bytes and
decodes them as a small object of the same format and layout.

A layout is a list of planes (codes, high bits, scales); within each plane, row ``r`` takes
``row_bytes`` bytes at ``offset + r · row_bytes``. Rows are independent in these layouts (every
scale belongs to one row), so decoding the gathered rows gives exactly the values decoding the
whole object would. Layouts whose scales are shared by several rows or tiled across them
(NVFP4's swizzled scales) have no row planes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import fp8_row
from .gguf_blocks import FORMAT_BLOCKS
from .gguf_blocks import LAYOUT as GGUF_LAYOUT
from .registry import codec_for
from .row_split import FORMATS as ROW_SPLIT_FORMATS
from .row_split import LAYOUT as ROW_SPLIT_LAYOUT
from .row_split import row_split_geometry

__all__ = ["RowPlane", "row_planes", "rows_object"]

CONTIGUOUS_LAYOUT = "contiguous_le_v1"


@dataclass(frozen=True)
class RowPlane:
    """One plane of an object: row ``r`` is ``row_bytes`` bytes at ``offset + r · row_bytes``."""

    offset: int
    row_bytes: int


def row_planes(
    format: str, layout: str, shape: tuple[int, ...], divisors: int | None = None
) -> tuple[RowPlane, ...] | None:
    """The planes of a ``format``/``layout`` object of ``shape`` ``[N, K]``, or None where its
    rows cannot be read apart (another rank, several divisors, or a layout that tiles rows)."""
    if len(shape) != 2 or (divisors or 1) != 1 or shape[0] < 1:
        return None
    n, k = shape
    if layout == ROW_SPLIT_LAYOUT and format in ROW_SPLIT_FORMATS:
        geo = row_split_geometry(format, (n, k))
        planes = (
            (0, geo.base_bytes),
            (geo.high_offset, geo.high_bytes),
            (geo.scale_offset, geo.size - geo.scale_offset),
        )
        return tuple(RowPlane(at, size // n) for at, size in planes if size)
    if layout == GGUF_LAYOUT and format in FORMAT_BLOCKS:
        _, values, block_bytes = FORMAT_BLOCKS[format]
        return (RowPlane(0, k // values * block_bytes),) if k % values == 0 else None
    if (format, layout) == (fp8_row.FORMAT, fp8_row.LAYOUT):
        geo = fp8_row.CODEC.geometry((n, k))
        return (RowPlane(0, k), RowPlane(geo.scale_offset, 2))
    if layout == CONTIGUOUS_LAYOUT:
        return (RowPlane(0, codec_for(format, layout).encoded_size((1, k))),)
    return None


def rows_object(
    format: str, layout: str, columns: int, planes: Sequence[np.ndarray], rows: int
) -> np.ndarray:
    """The bytes (uint8) of a ``[rows, columns]`` object in ``format``/``layout`` whose planes
    hold ``planes[i]``: each plane's rows' bytes, gathered in order. Gaps stay zero."""
    shape = (rows, columns)
    layout_planes = row_planes(format, layout, shape)
    if layout_planes is None or len(layout_planes) != len(planes):
        raise ValueError(f"{format}/{layout} of shape {list(shape)} has no such row planes")
    out = np.zeros(codec_for(format, layout).encoded_size(shape), dtype=np.uint8)
    for plane, data in zip(layout_planes, planes, strict=True):
        size = rows * plane.row_bytes
        if data.size != size:
            raise ValueError(f"a plane of {rows} rows takes {size} bytes, got {data.size}")
        out[plane.offset : plane.offset + size] = data.reshape(-1)
    return out
