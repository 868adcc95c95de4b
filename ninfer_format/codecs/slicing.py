"""A packed object's block of rows and columns as an object of its own, with the same stored
bits: a tensor-parallel rank's share of a weight, or an expert-offload window (a run of an
expert bank's rows), cut once at load so that the device holds and reads only those. The cut is
laid out exactly as an object of its shape is written, so the kernels' planes follow from that
shape. The layouts whose rows and column groups can be cut apart are here: row_split groups,
GGUF blocks, bf16, NVFP4 (whole 128-row scale tiles, 16-value blocks) and fp8 rows; any other
(or a cut through a group, block or scale tile) is None, and its share must be decoded.
"""

from __future__ import annotations

import numpy as np

from . import fp8_row, nvfp4
from .direct import as_object_bytes
from .gguf_blocks import FORMAT_BLOCKS
from .gguf_blocks import LAYOUT as GGUF_LAYOUT
from .row_split import FORMATS as ROW_SPLIT_FORMATS
from .row_split import LAYOUT as ROW_SPLIT_LAYOUT
from .row_split import pack_row_split, row_split_geometry, unpack_row_split

__all__ = ["slice_object", "stored_divisors"]

Span = tuple[int, int]


def slice_object(
    format: str, layout: str, data: np.ndarray, shape: tuple[int, int], rows: Span, columns: Span
) -> bytes | None:
    """The bytes of the object ``[rows[1] - rows[0], columns[1] - columns[0]]`` holding rows
    ``rows[0] .. rows[1] - 1`` and columns ``columns[0] .. columns[1] - 1`` of the stored
    ``[N, K]`` object ``data`` (uint8), in the same format and layout; None where the layout
    cannot be cut there. An NVFP4 cut keeps the weight divisors of the matrices its rows come
    from, so its divisor count may differ from the whole's: ``stored_divisors`` reads it off
    the cut's size."""
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
    if (format, layout) == (nvfp4.FORMAT, nvfp4.LAYOUT):
        return _nvfp4_cut(raw, shape, rows, columns)
    if (format, layout) == (fp8_row.FORMAT, fp8_row.LAYOUT):
        return _fp8_row_cut(raw, shape, rows, columns)
    return None


def stored_divisors(format: str, layout: str, shape: tuple[int, int], nbytes: int) -> int:
    """The weight divisor count of a stored ``[N, K]`` object of ``nbytes`` bytes: NVFP4 stores
    one FP32 divisor per stacked matrix after its scale plane, so its size tells the count (a
    cut's may differ from its whole's); every other layout has one."""
    if (format, layout) != (nvfp4.FORMAT, nvfp4.LAYOUT):
        return 1
    tail = nbytes - nvfp4.CODEC.geometry(shape).divisor_offset
    if tail < 4 or tail % 4:
        raise ValueError(f"{nbytes} bytes is no nvfp4 object of shape {list(shape)}")
    return tail // 4


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


def _nvfp4_cut(raw: np.ndarray, shape: tuple[int, int], rows: Span, columns: Span) -> bytes | None:
    """NVFP4 rows in whole 128-row tiles and columns on 16-value blocks, to a width of whole
    64-column tiles (the shapes an NVFP4 object can have).

    The code plane holds whole rows in order and the swizzled scale plane whole 128-row tiles in
    order (a tile of rows is ``128 * K / 16`` contiguous bytes), so a row cut is a slice of
    each; a cut through a tile would mix the scales of rows in and out of it. The weight
    divisors of the stacked matrices the rows come from travel with them, and a cut must take
    the same number of rows from each (row ``n`` uses divisor ``n // (N / divisors)``), else it
    is None. A column cut unswizzles the cut's scales, takes its blocks and swizzles them anew.
    """
    (r0, r1), (c0, c1) = rows, columns
    k = shape[1]
    divisors = stored_divisors(nvfp4.FORMAT, nvfp4.LAYOUT, shape, raw.size)
    whole = nvfp4.CODEC.geometry(shape, divisors)
    if r0 % nvfp4.TILE_ROWS or r1 % nvfp4.TILE_ROWS:
        return None
    if c0 % nvfp4.BLOCK or (c1 - c0) % nvfp4.TILE_COLUMNS:
        return None
    per = whole.rows_per_divisor
    first, last = r0 // per, (r1 - 1) // per
    taken = {min(r1, (i + 1) * per) - max(r0, i * per) for i in range(first, last + 1)}
    if len(taken) != 1:
        return None
    part = nvfp4.CODEC.geometry((r1 - r0, k), last - first + 1)
    out = np.zeros(part.size, dtype=np.uint8)
    out[: part.code_bytes] = raw[r0 * k // 2 : r1 * k // 2]
    scales = whole.scale_offset + r0 * k // nvfp4.BLOCK
    out[part.scale_offset : part.divisor_offset] = raw[scales : scales + part.scale_bytes]
    out[part.divisor_offset :] = raw[
        whole.divisor_offset + 4 * first : whole.divisor_offset + 4 * (last + 1)
    ]
    if (c0, c1) == (0, k):
        return out.tobytes()
    codes, natural, divs = nvfp4.unpack_nvfp4(out, (r1 - r0, k), part.divisors)
    blocks = natural[:, c0 // nvfp4.BLOCK : c1 // nvfp4.BLOCK]
    return nvfp4.pack_nvfp4(codes[:, c0:c1], blocks, divs)


def _fp8_row_cut(raw: np.ndarray, shape: tuple[int, int], rows: Span, columns: Span) -> bytes:
    """Any rows and columns of an fp8 row-scaled object: codes are row-major bytes with no
    padding or interleaving and each row has one scale, so the cut is the block of codes
    followed, at the cut's own aligned offset, by its rows' scale words."""
    (r0, r1), (c0, c1) = rows, columns
    k = shape[1]
    whole = fp8_row.CODEC.geometry(shape)
    raw = as_object_bytes(fp8_row.CODEC, raw, whole.size)
    part = fp8_row.CODEC.geometry((r1 - r0, c1 - c0))
    out = np.zeros(part.size, dtype=np.uint8)
    codes = raw[r0 * k : r1 * k].reshape(r1 - r0, k)[:, c0:c1]
    out[: codes.size] = codes.reshape(-1)
    out[part.scale_offset :] = raw[whole.scale_offset + 2 * r0 : whole.scale_offset + 2 * r1]
    return out.tobytes()
