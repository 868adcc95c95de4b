"""Cutting a packed object's rows and columns apart (``codecs.slicing``, a tensor-parallel
rank's share): the cut object decodes to the same block of the whole one's values, bit for bit;
a cut through a group or block is refused (None)."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_format.codecs import codec_for
from ninfer_format.codecs.gguf_blocks import FORMAT_BLOCKS
from ninfer_format.codecs.slicing import slice_object

ROW_SPLIT = ["q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16", "nf4_g64_fp16"]
GGUF = ["gguf_q4_k", "gguf_q6_k", "gguf_q8_0", "gguf_iq2_xxs"]


def stored(format: str, layout: str, shape: tuple[int, int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if layout == "gguf_blocks_v1":  # imported, never written here: random blocks decode too
        size = codec_for(format, layout).encoded_size(shape)
        return rng.integers(0, 256, size, dtype=np.uint8)
    values = rng.standard_normal(shape).astype(np.float32)
    return np.frombuffer(codec_for(format, layout).encode(values), dtype=np.uint8)


CASES = (
    [(f, "row_split_k128_v1", (7, 320), (2, 6), (64, 256)) for f in ROW_SPLIT]
    + [(f, "row_split_k128_v1", (5, 300), (0, 5), (128, 300)) for f in ROW_SPLIT]  # to a ragged end
    + [("bf16", "contiguous_le_v1", (6, 50), (1, 4), (3, 41))]
    + [(f, "gguf_blocks_v1", (4, 1024), (1, 3), (256, 768)) for f in GGUF]
)


@pytest.mark.parametrize(("fmt", "layout", "shape", "rows", "columns"), CASES)
def test_a_cut_object_decodes_to_the_block_it_was_cut_from(fmt, layout, shape, rows, columns):
    codec = codec_for(fmt, layout)
    data = stored(fmt, layout, shape, seed=shape[1])
    whole = codec.decode(data, shape)
    cut = slice_object(fmt, layout, data, shape, rows, columns)
    assert cut is not None
    part = (rows[1] - rows[0], columns[1] - columns[0])
    got = codec.decode(np.frombuffer(cut, dtype=np.uint8), part)
    np.testing.assert_array_equal(got, whole[rows[0] : rows[1], columns[0] : columns[1]])


@pytest.mark.parametrize("fmt", ROW_SPLIT)
def test_a_row_cut_is_the_bytes_of_those_rows_packed_anew(fmt):
    """Rows cut plane by plane (no decoding) are byte for byte what packing them gives,
    padding and gaps between planes included."""
    from ninfer_format.codecs.row_split import pack_row_split, unpack_row_split

    shape = (9, 200)
    data = stored(fmt, "row_split_k128_v1", shape, seed=3)
    codes, scales = unpack_row_split(fmt, data, shape)
    cut = slice_object(fmt, "row_split_k128_v1", data, shape, (3, 8), (0, 200))
    assert cut == pack_row_split(fmt, codes[3:8], scales[3:8])


def test_a_cut_through_a_group_or_block_is_refused():
    data = stored("q4_g64_fp16", "row_split_k128_v1", (4, 256), seed=1)
    assert (
        slice_object("q4_g64_fp16", "row_split_k128_v1", data, (4, 256), (0, 4), (32, 256)) is None
    )
    size = codec_for("gguf_q4_k", "gguf_blocks_v1").encoded_size((2, 512))
    blocks = np.zeros(size, dtype=np.uint8)
    assert slice_object("gguf_q4_k", "gguf_blocks_v1", blocks, (2, 512), (0, 2), (0, 128)) is None
    assert FORMAT_BLOCKS["gguf_q4_k"][1] == 256


def test_a_layout_that_cannot_be_cut_is_none_and_a_span_outside_is_an_error():
    nvfp4 = codec_for("nvfp4", "block_scale_k16_m128x4_v1")
    values = np.random.default_rng(2).standard_normal((128, 64)).astype(np.float32)
    data = np.frombuffer(nvfp4.encode(values), dtype=np.uint8)
    assert (
        slice_object("nvfp4", "block_scale_k16_m128x4_v1", data, (128, 64), (0, 64), (0, 64))
        is None
    )
    with pytest.raises(ValueError, match="not inside"):
        slice_object("bf16", "contiguous_le_v1", np.zeros(8, np.uint8), (2, 2), (0, 3), (0, 2))
