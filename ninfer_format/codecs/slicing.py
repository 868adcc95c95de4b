"""A packed object's block of rows and columns as an object of its own, with the same stored
bits: a tensor-parallel rank's share of a weight, cut once at load so that the rank holds and
reads only its share. The layouts whose rows and column groups can be cut apart are here;
any other (or a cut through a group or block) is None, and its share must be decoded.
"""

from __future__ import annotations

import numpy as np

from .gguf_blocks import FORMAT_BLOCKS
from .gguf_blocks import LAYOUT as GGUF_LAYOUT
from .row_split import FORMATS as ROW_SPLIT_FORMATS
from .row_split import LAYOUT as ROW_SPLIT_LAYOUT
from .row_split import pack_row_split, row_split_geometry, unpack_row_split

__all__ = ["slice_object"]

Span = tuple[int, int]


def slice_object(
    format: str, layout: str, data: np.ndarray, shape: tuple[int, int], rows: Span, columns: Span
) -> bytes | None:
    """The bytes of the object ``[rows[1] - rows[0], columns[1] - columns[0]]`` holding rows
    ``rows[0] .. rows[1] - 1`` and columns ``columns[0] .. columns[1] - 1`` of the stored
    ``[N, K]`` object ``data`` (uint8), in the same format and layout; None where the layout
    cannot be cut there."""
    n, k = shape
    (r0, r1), (c0, c1) = rows, columns
    if not (0 <= r0 < r1 <= n and 0 <= c0 < c1 <= k):
        raise ValueError(f"rows {rows}, columns {columns}: not inside a {n} x {k} object")
    raw = np.asarray(data, dtype=np.uint8).reshape(-1)
    if layout == ROW_SPLIT_LAYOUT and format in ROW_SPLIT_FORMATS:
        group = ROW_SPLIT_FORMATS[format].group
        if c0 % group or (c1 % group and c1 != k):
            return None
        cut = _row_split_rows(format, raw, shape, r0, r1)
        if (c0, c1) == (0, k):
            return cut
        codes, scales = unpack_row_split(format, np.frombuffer(cut, np.uint8), (r1 - r0, k))
        return pack_row_split(format, codes[:, c0:c1], scales[:, c0 // group : -(-c1 // group)])
    if layout == GGUF_LAYOUT and format in FORMAT_BLOCKS:
        _, values, nbytes = FORMAT_BLOCKS[format]
        if c0 % values or c1 % values:
            return None
        blocks = raw.reshape(n, k // values, nbytes)
        return blocks[r0:r1, c0 // values : c1 // values].tobytes()
    if (format, layout) == ("bf16", "contiguous_le_v1"):
        return raw.view("<u2").reshape(n, k)[r0:r1, c0:c1].tobytes()
    return None


def _row_split_rows(
    format: str, raw: np.ndarray, shape: tuple[int, int], r0: int, r1: int
) -> bytes:
    """Rows ``r0 .. r1 - 1`` of a row_split object: each of its planes (codes, high bits,
    scales) holds whole rows in order, so the cut is a slice of each, laid out anew (a
    mapped expert bank is never read beyond the rows asked for)."""
    whole = row_split_geometry(format, shape)
    part = row_split_geometry(format, (r1 - r0, shape[1]))
    out = np.zeros(part.size, dtype=np.uint8)
    planes = (
        (0, part.base_bytes, whole.base_bytes, 0),
        (whole.high_offset, part.high_bytes, whole.high_bytes, part.high_offset),
        (whole.scale_offset, part.size - part.scale_offset, whole.size - whole.scale_offset,
         part.scale_offset),
    )  # fmt: skip
    for start, part_bytes, whole_bytes, at in planes:
        if not part_bytes:
            continue
        per_row = whole_bytes // shape[0]
        out[at : at + part_bytes] = raw[start + r0 * per_row : start + r1 * per_row]
    return out.tobytes()
