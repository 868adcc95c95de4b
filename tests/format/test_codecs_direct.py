"""contiguous_le_v1: bf16, fp32, int32 (spec 3.1, 4.1)."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_format.codecs import codec_for
from ninfer_format.codecs.direct import BF16, FP32, INT32
from ninfer_format.errors import CodecError

LAYOUT = "contiguous_le_v1"


def as_data(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.uint8)


def test_registered_with_attributes():
    for codec, bits, dtype in (
        (BF16, 16, np.float32),
        (FP32, 32, np.float32),
        (INT32, 32, np.int32),
    ):
        assert codec_for(codec.format, LAYOUT) is codec
        assert codec.layout == LAYOUT and codec.alignment == 256 and codec.profile == "CORE"
        assert codec.bits_per_weight == bits and codec.decoded_dtype == np.dtype(dtype)


def test_encoded_sizes_and_scalars():
    assert BF16.encoded_size((3, 5)) == 30
    assert FP32.encoded_size(()) == 4
    assert INT32.encoded_size((2,) * 16) == 4 * 2**16
    assert FP32.decode(as_data(b"\x00\x00\x80\x3f"), ()).shape == ()
    assert FP32.encode(np.float32(2.0)) == b"\x00\x00\x00\x40"


@pytest.mark.parametrize(
    ("shape", "why"),
    [
        ((2,) * 17, "rank <= 16"),
        ((3, 0), "dimension > 0"),
        ((2.0, 3), "integers"),
        ((True,), "integers"),
    ],
)
def test_bad_shapes(shape, why):
    with pytest.raises(CodecError, match=f"fp32/contiguous_le_v1 needs .*{why}"):
        FP32.check_shape(shape)


def test_divisors_rejected():
    with pytest.raises(CodecError, match="divisors"):
        BF16.encoded_size((4,), divisors=2)


def test_little_endian_words():
    assert BF16.decode(as_data(b"\x80\x3f\x00\xc0"), (2,)).tolist() == [1.0, -2.0]
    assert FP32.decode(as_data(b"\x00\x00\x80\x3f"), (1,)).tolist() == [1.0]
    assert INT32.decode(as_data(b"\xff\xff\xff\xff\x00\x00\x00\x80"), (2,)).tolist() == [
        -1,
        -(2**31),
    ]
    assert INT32.decode(as_data(b"\x01\x00\x00\x00"), (1,)).dtype == np.int32


def test_bf16_all_words_round_trip_bit_exactly():
    raw = np.arange(1 << 16, dtype=np.uint32).astype("<u2").tobytes()
    values = BF16.decode(as_data(raw), (256, 256))
    assert values.dtype == np.float32 and values.shape == (256, 256)
    assert BF16.encode(values) == raw


def test_fp32_words_round_trip_bit_exactly():
    special = [0x7FC00001, 0x7F800001, 0xFFBFFFFF, 0x80000000, 0x7F800000, 0x00000001, 0xFF800000]
    rng = np.random.default_rng(1)
    words = np.concatenate([np.array(special, np.uint32), rng.integers(0, 2**32, 1000, np.uint32)])
    raw = words.astype("<u4").tobytes()
    values = FP32.decode(as_data(raw), (len(words),))
    assert np.array_equal(values.view(np.uint32), words)
    assert FP32.encode(values) == raw


def test_bf16_encode_rounds_to_nearest_even():
    values = np.array([0x3F808000, 0x3F818000, 0x3F808001], np.uint32).view(np.float32)
    assert np.frombuffer(BF16.encode(values), "<u2").tolist() == [0x3F80, 0x3F82, 0x3F81]
    assert np.frombuffer(BF16.encode(np.array([1.0, -0.0])), "<u2").tolist() == [0x3F80, 0x8000]


def test_int32_encode_checks_values():
    assert INT32.encode(np.array([1.0, -2.0])) == b"\x01\x00\x00\x00\xfe\xff\xff\xff"
    assert (
        INT32.encode(np.array([2**31 - 1, -(2**31)], np.int64))
        == b"\xff\xff\xff\x7f\x00\x00\x00\x80"
    )
    for bad in (
        np.array([1.5]),
        np.array([np.nan]),
        np.array([2.0**31]),
        np.array([2**40], np.int64),
    ):
        with pytest.raises(CodecError):
            INT32.encode(bad)


def test_wrong_length_and_scan():
    with pytest.raises(CodecError, match="must be 8 bytes, got 7"):
        FP32.decode(np.zeros(7, np.uint8), (2,))
    with pytest.raises(CodecError, match="must be 8 bytes"):
        FP32.scan(np.zeros(9, np.uint8), (2,))
    with pytest.raises(CodecError, match="1-D uint8"):
        FP32.decode(np.zeros(8, np.int8), (2,))
    assert BF16.scan(np.full(4, 0xFF, np.uint8), (2,)) == []
