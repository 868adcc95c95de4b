"""block_scale_k16_m128x4_v1 / nvfp4 (spec 3.3, 4.3, 6.1 divisors; notes 2.5)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer_format import numeric as nm
from ninfer_format.codecs import codec_for
from ninfer_format.codecs.nvfp4 import (
    CODEC,
    nvfp4_absmax,
    pack_nvfp4,
    swizzle_offsets,
    unpack_nvfp4,
)
from ninfer_format.errors import CodecError


def as_data(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.uint8).copy()


def random_parts(shape, divisors=1, seed=0):
    rng = np.random.default_rng(seed)
    n, k = shape
    codes = rng.integers(0, 16, shape).astype(np.uint8)
    scales = rng.integers(0, 0x7F, (n, k // 16)).astype(np.uint8)
    divs = rng.uniform(0.5, 3000, divisors).astype(np.float32)
    return codes, scales, divs


def test_registered_attributes():
    assert codec_for("nvfp4", "block_scale_k16_m128x4_v1") is CODEC
    assert CODEC.alignment == 256 and CODEC.profile == "CORE" and CODEC.bits_per_weight == 4.5
    assert CODEC.decoded_dtype == np.dtype(np.float32)


@pytest.mark.parametrize(
    ("shape", "divisors", "size"),
    [((14336, 5120), 1, 41_287_684), ((128, 64), 1, 4612), ((256, 64), 2, 8192 + 1024 + 8)],
)
def test_worked_sizes(shape, divisors, size):
    assert CODEC.encoded_size(shape, divisors) == size


@pytest.mark.parametrize(
    ("shape", "divisors", "message"),
    [
        ((100, 64), 1, r"N % 128 == 0, got shape \[100, 64\]"),
        ((128, 96), 1, r"K % 64 == 0, got shape \[128, 96\]"),
        ((128, 64, 1), 1, "rank 2"),
        ((128, 64), 2, r"\(N / divisors\) % 128 == 0"),
        ((384, 64), 2, "N % divisors == 0"),
        ((128, 64), 0, "divisors count >= 1"),
    ],
)
def test_bad_shapes(shape, divisors, message):
    with pytest.raises(CodecError, match="nvfp4/block_scale_k16_m128x4_v1 needs .*" + message):
        CODEC.check_shape(shape, divisors)


def test_shape_message_is_exact():
    with pytest.raises(CodecError) as caught:
        CODEC.check_shape((100, 64))
    assert (
        str(caught.value)
        == "nvfp4/block_scale_k16_m128x4_v1 needs N % 128 == 0, got shape [100, 64]"
    )


def test_swizzle_offsets_spec_vectors():
    offsets = swizzle_offsets(256, 128)
    expected = {
        (0, 0): 0,
        (1, 0): 16,
        (31, 0): 496,
        (32, 0): 4,
        (96, 0): 12,
        (0, 1): 1,
        (0, 4): 512,
        (127, 7): 1023,
        (128, 0): 1024,
        (255, 7): 2047,
    }
    assert {place: int(offsets[place]) for place in expected} == expected
    assert np.array_equal(np.sort(offsets.ravel()), np.arange(256 * 128 // 16))


@pytest.mark.parametrize(("shape", "divisors"), [((128, 64), 1), ((256, 128), 1), ((384, 192), 3)])
def test_pack_layout_and_unpack(shape, divisors):
    codes, scales, divs = random_parts(shape, divisors, seed=shape[0])
    raw = np.frombuffer(pack_nvfp4(codes, scales, divs), np.uint8)
    n, k = shape
    assert len(raw) == CODEC.encoded_size(shape, divisors)
    assert np.array_equal(raw[: n * k // 2], (codes[:, 0::2] | (codes[:, 1::2] << 4)).ravel())
    scale_off = n * k // 2  # always a multiple of 256 for legal shapes
    assert np.array_equal(raw[scale_off + swizzle_offsets(n, k)], scales)
    assert raw[scale_off + n * k // 16 :].tobytes() == divs.astype("<f4").tobytes()
    got = unpack_nvfp4(raw, shape, divisors)
    for a, b in zip(got, (codes, scales, divs), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_divisor_bits_are_preserved():
    codes, scales, _ = random_parts((128, 64))
    nan = np.array([0x7FC12345], np.uint32).view(np.float32)
    raw = as_data(pack_nvfp4(codes, scales, nan))
    assert unpack_nvfp4(raw, (128, 64))[2].view(np.uint32).tolist() == [0x7FC12345]


def test_pack_rejects_bad_input():
    codes, scales, divs = random_parts((128, 64))
    with pytest.raises(CodecError, match=r"\[0, 15\]"):
        pack_nvfp4(codes + 16, scales, divs)
    with pytest.raises(CodecError, match=r"shape \[128, 4\]"):
        pack_nvfp4(codes, scales[:, :3], divs)
    with pytest.raises(CodecError, match="N % divisors"):
        pack_nvfp4(codes, scales, np.ones(3, np.float32))


@pytest.mark.parametrize("divisors", [1, 2])
def test_decode_formula(divisors):
    codes, scales, divs = random_parts((256, 128), divisors, seed=7)
    values = CODEC.decode(as_data(pack_nvfp4(codes, scales, divs)), (256, 128), divisors)
    block_scale = np.repeat(nm.e4m3fn_to_f32(scales), 16, axis=1)
    row_divisor = np.repeat(divs, 256 // divisors)[:, None]
    expected = nm.e2m1_to_f32(codes) * block_scale / row_divisor
    assert values.dtype == np.float32 and np.array_equal(values, expected)


def test_encode_divisor_and_thresholds():
    x = np.zeros((128, 64), np.float32)
    x[0, 0] = 0.5
    assert nvfp4_absmax(x)[2].tolist() == [5376.0]
    # Global absmax 2688 makes d_w = 1; a block with absmax 6 gets scale 1.0 so y == x.
    x = np.zeros((128, 64), np.float32)
    x[1, 16] = 2688
    x[0, :16] = [6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -5, -6, 0.3, 0, -0.0, 1]
    codes, scales, divs = nvfp4_absmax(x)
    assert divs.tolist() == [1.0] and scales[0, 0] == 0x38 and scales[1, 1] == 0x7E
    assert codes[0, :16].tolist() == [7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 14, 15, 1, 0, 8, 2]
    assert scales[0, 1] == 0 and not codes[0, 16:32].any()


def test_encode_rescues_tiny_block_scale():
    x = np.zeros((128, 64), np.float32)
    x[0, 0] = 1.0
    x[0, 16] = 1e-6
    _, scales, _ = nvfp4_absmax(x)
    assert scales[0, 1] == 0x01


@pytest.mark.parametrize("divisors", [1, 2])
def test_absmax_round_trip(divisors):
    rng = np.random.default_rng(divisors)
    x = rng.standard_normal((256, 128)).astype(np.float32)
    x[128:] *= 50  # the second matrix has its own range
    raw = as_data(CODEC.encode(x, divisors))
    assert CODEC.scan(raw, x.shape, divisors) == []
    _, scales, divs = unpack_nvfp4(raw, x.shape, divisors)
    assert len(divs) == divisors
    step = (
        np.repeat(nm.e4m3fn_to_f32(scales), 16, axis=1) / np.repeat(divs, 256 // divisors)[:, None]
    )
    err = np.abs(CODEC.decode(raw, x.shape, divisors) - x)
    assert np.all(err <= step * 1.0001)  # largest E2M1 half-gap (between 4 and 6) is 1


def test_encode_rejects_non_finite():
    x = np.zeros((128, 64), np.float32)
    x[5, 5] = np.nan
    with pytest.raises(CodecError, match="non-finite"):
        CODEC.encode(x)
    x[5, 5] = 1e-45  # divisor 2688 / 1e-45 overflows float32
    with pytest.raises(CodecError, match="weight divisor"):
        CODEC.encode(x)


@pytest.mark.parametrize(("byte", "text"), [(0x80, "sign bit"), (0xB8, "sign bit"), (0x7F, "NaN")])
def test_scan_bad_scale(byte, text):
    codes, scales, divs = random_parts((256, 128))
    scales[200, 3] = byte
    [finding] = CODEC.scan(as_data(pack_nvfp4(codes, scales, divs)), (256, 128))
    assert finding.severity == "error" and text in finding.message
    assert "row 200 group 3" in finding.message


@pytest.mark.parametrize("divisor", [0.0, -0.0, -1.0, np.inf, np.nan])
def test_scan_bad_divisor(divisor):
    codes, scales, _ = random_parts((256, 64))
    divs = np.array([1.0, divisor], np.float32)
    [finding] = CODEC.scan(as_data(pack_nvfp4(codes, scales, divs)), (256, 64), 2)
    assert finding.severity == "error" and "weight divisor 1" in finding.message


def test_wrong_length():
    with pytest.raises(CodecError, match="must be 4612 bytes"):
        CODEC.decode(np.zeros(4616, np.uint8), (128, 64))
    with pytest.raises(CodecError, match="must be 9224 bytes"):
        CODEC.scan(np.zeros(9220, np.uint8), (256, 64), 2)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_any_bytes_decode_and_scan_without_crashing(seed):
    raw = np.random.default_rng(seed).integers(0, 256, CODEC.encoded_size((256, 64), 2), np.uint8)
    assert CODEC.decode(raw, (256, 64), 2).shape == (256, 64)
    CODEC.scan(raw, (256, 64), 2)
