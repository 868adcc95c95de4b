"""Row planes (``codecs.row_planes``): any rows of a stored object, gathered plane by plane and
laid out as a small object of the same format, decode to exactly those rows of the whole
object's values; a layout that tiles rows together has no planes."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_format.codecs import codec_for
from ninfer_format.codecs.row_planes import row_planes, rows_object
from tests.format.test_codecs_slicing import GGUF, ROW_SPLIT, stored

CASES = (
    [(f, "row_split_k128_v1", (9, 300)) for f in ROW_SPLIT]
    + [("bf16", "contiguous_le_v1", (9, 50)), ("fp32", "contiguous_le_v1", (9, 7))]
    + [("fp8_e4m3fn_row_bf16", "row_scale_v1", (9, 48))]
    + [(f, "gguf_blocks_v1", (9, 512)) for f in GGUF[:2]]
)


@pytest.mark.parametrize(("fmt", "layout", "shape"), CASES)
def test_gathered_rows_decode_to_the_whole_objects_rows(fmt, layout, shape):
    codec = codec_for(fmt, layout)
    data = stored(fmt, layout, shape, seed=shape[1])
    planes = row_planes(fmt, layout, shape)
    assert planes is not None
    assert sum(p.row_bytes for p in planes) * shape[0] <= data.size
    rows = np.array([0, 3, 4, 8])
    gathered = [
        np.concatenate([data[p.offset + r * p.row_bytes :][: p.row_bytes] for r in rows])
        for p in planes
    ]
    small = rows_object(fmt, layout, shape[1], gathered, rows.size)
    np.testing.assert_array_equal(
        codec.decode(small, (rows.size, shape[1])), codec.decode(data, shape)[rows]
    )


def test_tiled_and_stacked_objects_have_no_row_planes():
    assert row_planes("nvfp4", "block_scale_k16_m128x4_v1", (128, 64)) is None
    assert row_planes("bf16", "contiguous_le_v1", (4, 8), divisors=2) is None
    assert row_planes("bf16", "contiguous_le_v1", (4, 8, 2)) is None
