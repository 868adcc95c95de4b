"""row_scale_v1 / fp8_e4m3fn_row_bf16 (spec 3.4, 4.4; notes 2.4)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer_format import numeric as nm
from ninfer_format.codecs import codec_for
from ninfer_format.codecs.fp8_row import CODEC, fp8_row_maxabs, pack_fp8_row, unpack_fp8_row
from ninfer_format.errors import CodecError


def as_data(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.uint8).copy()


def random_parts(shape, seed=0):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, shape).astype(np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x7E
    scales = rng.integers(0x0001, 0x7F80, shape[0]).astype(np.uint16)
    return codes, scales


def test_registered_attributes():
    assert codec_for("fp8_e4m3fn_row_bf16", "row_scale_v1") is CODEC
    assert CODEC.alignment == 256 and CODEC.profile == "CORE" and CODEC.bits_per_weight == 8
    assert CODEC.decoded_dtype == np.dtype(np.float32)


@pytest.mark.parametrize(
    ("shape", "size"), [((14336, 5120), 73_428_992), ((3, 5), 262), ((1, 256), 258)]
)
def test_worked_sizes(shape, size):
    assert CODEC.encoded_size(shape) == size


@pytest.mark.parametrize("shape", [(5,), (0, 3), (2, 2, 2)])
def test_bad_shapes(shape):
    with pytest.raises(CodecError, match="fp8_e4m3fn_row_bf16/row_scale_v1 needs"):
        CODEC.check_shape(shape)


@pytest.mark.parametrize(
    ("row", "scale", "codes"),
    [
        ([448, 1.0625, 1.1875, -1.0625, -1.1875], 0x3F80, "7e383ab8ba"),
        ([2, -2, 1, -1], 0x3B92, "7efe76f6"),
    ],
)
def test_golden_vectors(row, scale, codes):
    got_codes, got_scales = fp8_row_maxabs(np.array([row], np.float32))
    assert got_scales.tolist() == [scale] and bytes(got_codes[0]).hex() == codes
    raw = CODEC.encode(np.array([row], np.float32))
    assert raw[: len(row)].hex() == codes and raw[256:258] == scale.to_bytes(2, "little")


def test_negative_zero_and_zero_rows():
    codes, scales = fp8_row_maxabs(np.array([[1, -0.0, 0.5, -1, -0.5], [0, -0.0, 0, 0, 0]]))
    assert scales.tolist() == [0x3B12, 0] and codes[0, 1] == 0x80
    assert codes[1].tolist() == [0, 0, 0, 0, 0]


def test_scale_underflow_rescue():
    # The reciprocal of the smallest BF16 subnormal overflows: non-zero values saturate.
    codes, scales = fp8_row_maxabs(np.array([[1e-39, 0, -0.0, -1e-39]], np.float32))
    assert scales.tolist() == [0x0001] and codes.tolist() == [[0x7E, 0x00, 0x80, 0xFE]]


def test_pack_layout_and_unpack():
    codes, scales = random_parts((3, 7), seed=1)
    raw = np.frombuffer(pack_fp8_row(codes, scales), np.uint8)
    assert len(raw) == 262
    assert np.array_equal(raw[:21], codes.ravel()) and not raw[21:256].any()
    assert raw[256:].tobytes() == scales.astype("<u2").tobytes()
    got_codes, got_scales = unpack_fp8_row(raw, (3, 7))
    assert np.array_equal(got_codes, codes) and np.array_equal(got_scales, scales)
    assert got_codes.dtype == np.uint8 and got_scales.dtype == np.uint16
    assert CODEC.scan(raw, (3, 7)) == []


def test_decode_formula_including_negative_scale():
    codes, scales = random_parts((4, 33), seed=2)
    scales[1] |= 0x8000
    values = CODEC.decode(as_data(pack_fp8_row(codes, scales)), (4, 33))
    expected = nm.e4m3fn_to_f32(codes) * nm.bf16_to_f32(scales)[:, None]
    assert values.dtype == np.float32 and np.array_equal(values, expected)


def test_absmax_round_trip_error_bound():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((6, 300)) * rng.uniform(1e-3, 1e3, (6, 1))).astype(np.float32)
    raw = as_data(CODEC.encode(x))
    assert CODEC.scan(raw, x.shape) == []
    _, scales = unpack_fp8_row(raw, x.shape)
    scale = nm.bf16_to_f32(scales)[:, None]
    err = np.abs(CODEC.decode(raw, x.shape) - x)
    # E4M3 keeps 3 fraction bits (half-ulp 2^-4 relative), subnormals step 2^-9 * scale;
    # the BF16 pre-rounding of the source adds 2^-9 relative.
    assert np.all(err <= np.abs(x) * (2.0**-4 + 2.0**-8) + scale * 2.0**-10)


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e39])
def test_encode_rejects_non_finite(bad):
    with pytest.raises(CodecError, match="non-finite"):
        CODEC.encode(np.array([[1.0, bad]]))


@pytest.mark.parametrize(("code", "text"), [(0x7F, "NaN code"), (0xFF, "NaN code")])
def test_scan_nan_codes(code, text):
    codes, scales = random_parts((3, 5))
    codes[2, 1] = code
    [finding] = CODEC.scan(as_data(pack_fp8_row(codes, scales)), (3, 5))
    assert (
        finding.severity == "error" and text in finding.message and "row 2 (1)" in finding.message
    )


@pytest.mark.parametrize(
    ("word", "text"),
    [(0x8000, "negative"), (0xBF80, "negative"), (0x7F80, "Inf or NaN"), (0x7FC1, "Inf or NaN")],
)
def test_scan_bad_scales(word, text):
    codes, scales = random_parts((3, 5))
    scales[1] = word
    [finding] = CODEC.scan(as_data(pack_fp8_row(codes, scales)), (3, 5))
    assert finding.severity == "error" and text in finding.message and "row 1" in finding.message


def test_scan_codes_under_zero_scale():
    codes = np.zeros((2, 4), np.uint8)
    codes[0] = [0x00, 0x80, 0x80, 0x00]  # +-0 is fine under a zero scale
    codes[1] = [0x00, 0x01, 0x80, 0xC0]
    found = CODEC.scan(as_data(pack_fp8_row(codes, np.array([0, 0], np.uint16))), (2, 4))
    assert [(f.severity, "row 1 (2)" in f.message) for f in found] == [("error", True)]


def test_scan_nonzero_gap():
    codes, scales = random_parts((3, 5))
    raw = as_data(pack_fp8_row(codes, scales))
    raw[100] = 1
    [finding] = CODEC.scan(raw, (3, 5))
    assert finding.severity == "warning" and "non-zero padding" in finding.message


def test_wrong_length():
    with pytest.raises(CodecError, match="must be 262 bytes"):
        CODEC.decode(np.zeros(261, np.uint8), (3, 5))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 70), st.integers(0, 2**32 - 1))
def test_any_bytes_decode_and_scan_without_crashing(n, k, seed):
    raw = np.random.default_rng(seed).integers(0, 256, CODEC.encoded_size((n, k)), np.uint8)
    assert CODEC.decode(raw, (n, k)).shape == (n, k)
    CODEC.scan(raw, (n, k))
