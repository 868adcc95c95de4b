"""Cutting a packed object's rows and columns apart (``codecs.slicing``, a tensor-parallel
rank's share, an expert-offload window): the cut object decodes to the same block of the whole
one's values, bit for bit, and is as long as an object of its shape; a cut through a group,
block or NVFP4 scale tile is refused (None)."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_format.codecs import codec_for
from ninfer_format.codecs.gguf_blocks import FORMAT_BLOCKS
from ninfer_format.codecs.slicing import slice_object, stored_divisors

ROW_SPLIT = ["q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16", "nf4_g64_fp16"]
GGUF = ["gguf_q4_k", "gguf_q6_k", "gguf_q8_0", "gguf_iq2_xxs"]
NVFP4 = ("nvfp4", "block_scale_k16_m128x4_v1")
FP8 = ("fp8_e4m3fn_row_bf16", "row_scale_v1")


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
    # NVFP4: whole 128-row tiles; columns on 16-value blocks, off the 64-column scale tiles
    + [(*NVFP4, (384, 192), (128, 384), (0, 192))]
    + [(*NVFP4, (384, 192), (0, 256), (16, 144))]
    + [(*NVFP4, (256, 320), (128, 256), (256, 320))]
    # fp8 rows: any rows and columns (per-row scales, codes row-major, no padding)
    + [(*FP8, (7, 37), (2, 7), (3, 29))]
    + [(*FP8, (5, 300), (0, 5), (1, 300))]
    + [(*FP8, (9, 64), (4, 5), (0, 64))]
)


@pytest.mark.parametrize(("fmt", "layout", "shape", "rows", "columns"), CASES)
def test_a_cut_object_decodes_to_the_block_it_was_cut_from(fmt, layout, shape, rows, columns):
    codec = codec_for(fmt, layout)
    data = stored(fmt, layout, shape, seed=shape[1])
    whole = codec.decode(data, shape)
    cut = slice_object(fmt, layout, data, shape, rows, columns)
    assert cut is not None
    part = (rows[1] - rows[0], columns[1] - columns[0])
    assert len(cut) == codec.encoded_size(part)
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


def test_nvfp4_and_fp8_row_cuts_are_the_bytes_of_those_rows_packed_anew():
    """Rows cut plane by plane are byte for byte what packing them gives: the swizzled scale
    tiles, the gap before the scale plane and the divisor in place."""
    from ninfer_format.codecs.fp8_row import pack_fp8_row, unpack_fp8_row
    from ninfer_format.codecs.nvfp4 import pack_nvfp4, unpack_nvfp4

    data = stored(*NVFP4, (384, 64), seed=4)
    codes, scales, divisors = unpack_nvfp4(data, (384, 64))
    cut = slice_object(*NVFP4, data, (384, 64), (128, 384), (0, 64))
    assert cut == pack_nvfp4(codes[128:384], scales[128:384], divisors)
    data = stored(*FP8, (11, 30), seed=5)
    codes, scales = unpack_fp8_row(data, (11, 30))
    cut = slice_object(*FP8, data, (11, 30), (3, 10), (0, 30))
    assert cut == pack_fp8_row(codes[3:10], scales[3:10])


@pytest.mark.parametrize(
    ("rows", "columns", "divisors"),
    [
        ((256, 512), (0, 128), 1),  # inside matrix 1: its divisor alone
        ((0, 512), (0, 128), 2),  # matrices 0 and 1
        ((128, 384), (64, 128), 2),  # half of 0, half of 1: 128 rows each
        ((0, 768), (16, 80), 3),  # all three, a column cut
    ],
)
def test_an_nvfp4_cut_keeps_the_divisors_of_the_matrices_its_rows_come_from(
    rows, columns, divisors
):
    """Three matrices stacked along N with a divisor each (256 rows per divisor)."""
    codec = codec_for(*NVFP4)
    values = np.random.default_rng(6).standard_normal((768, 128)).astype(np.float32)
    values[256:512] *= 40  # the matrices' divisors differ
    data = np.frombuffer(codec.encode(values, 3), dtype=np.uint8)
    whole = codec.decode(data, (768, 128), 3)
    cut = slice_object(*NVFP4, data, (768, 128), rows, columns)
    assert cut is not None
    part = (rows[1] - rows[0], columns[1] - columns[0])
    assert stored_divisors(*NVFP4, part, len(cut)) == divisors
    assert len(cut) == codec.encoded_size(part, divisors)
    got = codec.decode(np.frombuffer(cut, dtype=np.uint8), part, divisors)
    np.testing.assert_array_equal(got, whole[rows[0] : rows[1], columns[0] : columns[1]])


@pytest.mark.parametrize(
    ("shape", "divisors", "rows", "columns"),
    [
        ((384, 192), 1, (0, 64), (0, 192)),  # rows end inside a 128-row scale tile
        ((384, 192), 1, (64, 192), (0, 192)),  # and start inside one
        ((384, 192), 1, (0, 128), (8, 72)),  # columns through a 16-value block
        ((384, 192), 1, (0, 128), (16, 96)),  # a width of no whole 64-column tiles
        ((768, 128), 3, (128, 512), (0, 128)),  # 128 rows of matrix 0, 256 of matrix 1
    ],
)
def test_an_nvfp4_cut_through_a_tile_block_or_uneven_divisors_is_refused(
    shape, divisors, rows, columns
):
    values = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    data = np.frombuffer(codec_for(*NVFP4).encode(values, divisors), dtype=np.uint8)
    assert slice_object(*NVFP4, data, shape, rows, columns) is None


def test_stored_divisors_reads_the_count_off_an_nvfp4_size_and_is_one_elsewhere():
    codec = codec_for(*NVFP4)
    assert stored_divisors(*NVFP4, (512, 64), codec.encoded_size((512, 64), 4)) == 4
    assert stored_divisors(*FP8, (7, 37), codec_for(*FP8).encoded_size((7, 37))) == 1
    with pytest.raises(ValueError, match="no nvfp4 object"):
        stored_divisors(*NVFP4, (512, 64), codec.encoded_size((512, 64)) - 2)


def test_a_cut_through_a_group_or_block_is_refused():
    data = stored("q4_g64_fp16", "row_split_k128_v1", (4, 256), seed=1)
    assert (
        slice_object("q4_g64_fp16", "row_split_k128_v1", data, (4, 256), (0, 4), (32, 256)) is None
    )
    size = codec_for("gguf_q4_k", "gguf_blocks_v1").encoded_size((2, 512))
    blocks = np.zeros(size, dtype=np.uint8)
    assert slice_object("gguf_q4_k", "gguf_blocks_v1", blocks, (2, 512), (0, 2), (0, 128)) is None
    assert FORMAT_BLOCKS["gguf_q4_k"][1] == 256


def test_a_layout_not_cut_here_is_none_and_a_span_outside_is_an_error():
    """fp32 objects are not cut: a share of one is its decoded values anyway."""
    data = np.zeros(4 * 6, dtype=np.uint8)
    assert slice_object("fp32", "contiguous_le_v1", data, (2, 3), (0, 1), (0, 3)) is None
    with pytest.raises(ValueError, match="not inside"):
        slice_object("bf16", "contiguous_le_v1", np.zeros(8, np.uint8), (2, 2), (0, 3), (0, 2))
