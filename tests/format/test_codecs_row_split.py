"""row_split_k128_v1: q4/q5/q6/q8 and nf4 (spec 3.2, 4.2; notes 2.1, 3.1; decision 4)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer_format import numeric as nm
from ninfer_format.codecs import codec_for
from ninfer_format.codecs.row_split import (
    CODECS,
    FORMATS,
    grouped_absmax,
    pack_row_split,
    row_split_geometry,
    unpack_row_split,
)
from ninfer_format.errors import CodecError

LAYOUT = "row_split_k128_v1"
Q4, Q5, Q6, Q8, NF4 = "q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16", "nf4_g64_fp16"
AWKWARD_K = [1, 63, 64, 65, 127, 129, 300]
ONE = 0x3C00  # binary16 1.0


def as_data(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.uint8).copy()


def reference_pack(format: str, codes: np.ndarray, scales: np.ndarray) -> bytes:
    """Spec 4.2's address table, one lane at a time (small inputs only)."""
    fmt = FORMATS[format]
    geo = row_split_geometry(format, codes.shape)
    out = bytearray(geo.size)
    n_rows, k = codes.shape
    for n in range(n_rows):
        for g in range(geo.groups_per_row):
            j = n * geo.groups_per_row + g
            scale = int(scales[n, g]) if g < geo.real_groups else 0
            out[geo.scale_offset + 2 * j : geo.scale_offset + 2 * j + 2] = scale.to_bytes(
                2, "little"
            )
            for i in range(fmt.group):
                column = g * fmt.group + i
                code = int(codes[n, column]) if column < k else fmt.pad_code
                u = code % (1 << fmt.bits)
                if fmt.bits == 8:
                    out[32 * j + i] = u
                else:
                    out[32 * j + i // 2] |= (u & 0xF) << (4 * (i % 2))
                if fmt.bits == 5:
                    out[geo.high_offset + 8 * j + i // 8] |= ((u >> 4) & 1) << (i % 8)
                if fmt.bits == 6:
                    out[geo.high_offset + 16 * j + i // 4] |= ((u >> 4) & 3) << (2 * (i % 4))
    return bytes(out)


def random_codes(format: str, shape: tuple[int, int], seed: int = 0):
    fmt = FORMATS[format]
    rng = np.random.default_rng(seed)
    codes = rng.integers(fmt.qmin, fmt.qmax + 1, shape)
    scales = rng.integers(0x0001, 0x7C00, (shape[0], -(-shape[1] // fmt.group))).astype(np.uint16)
    return codes, scales


# --- registration and sizes -----------------------------------------------------------------


def test_registered_attributes():
    expected = {Q4: 4.25, Q5: 5.25, Q6: 6.25, Q8: 8.5, NF4: 4.25}
    for name, bits in expected.items():
        codec = codec_for(name, LAYOUT)
        assert codec is CODECS[name] and codec.format == name and codec.layout == LAYOUT
        assert codec.alignment == 256 and codec.bits_per_weight == bits
        assert codec.decoded_dtype == np.dtype(np.float32)
        assert codec.profile == ("ninfer" if name == NF4 else "CORE")


@pytest.mark.parametrize(
    ("format", "shape", "size"),
    [
        (Q4, (7168, 5120), 19_496_960),
        (Q5, (7168, 5120), 24_084_480),
        (Q6, (7168, 5120), 28_672_000),
        (Q8, (7168, 5120), 38_993_920),
        (Q5, (2, 130), 528),
        (Q4, (256, 128), 17_408),
        (Q5, (256, 128), 21_504),
        (NF4, (256, 128), 17_408),
    ],
)
def test_worked_sizes(format, shape, size):
    assert CODECS[format].encoded_size(shape) == size


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4), (0, 64), (4, 0)])
def test_bad_shapes(shape):
    with pytest.raises(CodecError, match="q4_g64_fp16/row_split_k128_v1 needs"):
        CODECS[Q4].check_shape(shape)


def test_divisors_rejected():
    with pytest.raises(CodecError, match="divisors"):
        CODECS[Q4].check_shape((128, 128), divisors=2)


# --- golden vectors -------------------------------------------------------------------------


def test_golden_bf16_scale_word():
    x = nm.bf16_to_f32(np.full((1, 64), 0x3636, np.uint16))
    assert grouped_absmax(Q4, x)[1].tolist() == [[6]]


def test_golden_reciprocal_multiply():
    x = np.array([[0x41A0B334, 0x417C7BFF]], np.uint32).view(np.float32)
    codes, scales = grouped_absmax(Q4, x)
    assert scales.tolist() == [[0x41BD]] and codes.tolist() == [[7, 6]]


def test_golden_ties_to_even():
    codes, _ = grouped_absmax(Q4, np.array([[7, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5]]))
    assert codes.tolist() == [[7, 0, 2, 2, 0, -2, -2]]


def test_golden_unit_scale():
    codes, scales = grouped_absmax(Q4, np.array([[-7, -1, 0, 1, 7, 3.5, -3.5, 0.25]]))
    assert scales.tolist() == [[ONE]] and codes.tolist() == [[-7, -1, 0, 1, 7, 4, -4, 0]]


def test_golden_underflow_rescue():
    assert grouped_absmax(Q4, np.array([[np.finfo(np.float32).tiny]]))[1].tolist() == [[1]]


@pytest.mark.parametrize(
    ("format", "codes", "base", "high"),
    [
        (Q4, [-8, -7, -1, 0, 1, 7], "980f71", ""),
        (Q5, [-16, -15, -1, 0, 1, 15], "100ff1", "07"),
        (Q6, [-32, -31, -17, -16, -1, 0, 15, 31], "100f0fff", "ea43"),
        (Q8, [-127, -1, 0, 1, 127], "81ff00017f", ""),
    ],
)
def test_golden_bytes(format, codes, base, high):
    raw = pack_row_split(format, np.array([codes]), np.array([[ONE]], np.uint16))
    assert raw[: len(base) // 2].hex() == base
    if high:
        assert raw[256 : 256 + len(high) // 2].hex() == high
    assert raw == reference_pack(format, np.array([codes]), np.array([[ONE]] * 4, np.uint16))


# --- pack / unpack --------------------------------------------------------------------------


@pytest.mark.parametrize("format", list(FORMATS))
@pytest.mark.parametrize("k", AWKWARD_K)
def test_pack_matches_spec_table_and_unpacks(format, k):
    codes, scales = random_codes(format, (3, k), seed=k)
    raw = pack_row_split(format, codes, scales)
    assert raw == reference_pack(format, codes, scales)
    got_codes, got_scales = unpack_row_split(format, as_data(raw), (3, k))
    assert np.array_equal(got_codes, codes) and np.array_equal(got_scales, scales)
    assert got_codes.dtype == (np.uint8 if format == NF4 else np.int8)
    assert got_scales.dtype == np.uint16
    assert CODECS[format].scan(as_data(raw), (3, k)) == []


def test_padding_bytes_q5_2x130():
    codes, scales = random_codes(Q5, (2, 130), seed=5)
    raw = np.frombuffer(pack_row_split(Q5, codes, scales), np.uint8)
    assert len(raw) == 528
    for n in range(2):
        j = n * 4
        assert not raw[32 * (j + 2) + 1 : 32 * (j + 4)].any()  # lanes 130.. and group 3
        assert raw[256 + 8 * (j + 2)] >> 2 == 0  # high bits of lanes 130..135
        assert not raw[256 + 8 * (j + 2) + 1 : 256 + 8 * (j + 4)].any()
        assert raw[512 + 2 * (j + 3) : 512 + 2 * (j + 4)].tolist() == [0, 0]
    assert not raw[320:512].any()  # gap between the high plane and the scales


def test_nf4_padding_is_code_7():
    codes = np.zeros((1, 65), np.uint8)
    raw = np.frombuffer(pack_row_split(NF4, codes, np.array([[ONE, ONE]], np.uint16)), np.uint8)
    assert raw[32] == 0x70 and np.all(raw[33:64] == 0x77) and np.all(raw[:32] == 0)
    assert raw[128 + 4 : 128 + 8].tolist() == [0, 0, 0, 0]  # wholly padded group: scale 0


def test_pack_rejects_bad_input():
    with pytest.raises(CodecError, match=r"codes must lie in \[-127, 127\]"):
        pack_row_split(Q8, np.array([[-128]]), np.array([[ONE]], np.uint16))
    with pytest.raises(CodecError, match=r"\[0, 15\]"):
        pack_row_split(NF4, np.array([[16]]), np.array([[ONE]], np.uint16))
    with pytest.raises(CodecError, match=r"shape \[1, 1\]"):
        pack_row_split(Q4, np.array([[1]]), np.array([[ONE, ONE]], np.uint16))
    with pytest.raises(CodecError, match="no row_split_k128_v1 codec"):
        pack_row_split("q3_g64_fp16", np.array([[1]]), np.array([[ONE]], np.uint16))


# --- decode and encode ----------------------------------------------------------------------


@pytest.mark.parametrize("format", list(FORMATS))
def test_decode_is_scale_times_code(format):
    codes, scales = random_codes(format, (4, 300), seed=2)
    values = CODECS[format].decode(as_data(pack_row_split(format, codes, scales)), (4, 300))
    scale = np.repeat(nm.f16_to_f32(scales), FORMATS[format].group, axis=1)[:, :300]
    level = nm.NF4_CODEBOOK[codes] if format == NF4 else codes.astype(np.float32)
    assert values.dtype == np.float32 and values.shape == (4, 300)
    assert np.array_equal(values, scale * level)


def test_negative_scale_decodes_signed_and_is_reported():
    raw = as_data(pack_row_split(Q4, np.array([[1, -2, -8]]), np.array([[0xBC00]], np.uint16)))
    assert CODECS[Q4].decode(raw, (1, 3)).tolist() == [[-1, 2, 8]]
    [finding] = CODECS[Q4].scan(raw, (1, 3))
    assert finding.severity == "warning" and "negative scale (EXT-ALL dialect)" in finding.message
    nf4 = as_data(pack_row_split(NF4, np.array([[15]]), np.array([[0xC000]], np.uint16)))
    assert CODECS[NF4].decode(nf4, (1, 1)).tolist() == [[-2.0]]
    assert [f.severity for f in CODECS[NF4].scan(nf4, (1, 1))] == ["error"]


@pytest.mark.parametrize("format", [Q4, Q5, Q6, Q8])
@pytest.mark.parametrize("k", [1, 65, 300])
def test_absmax_round_trip_error_bound(format, k):
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((5, k)) * rng.uniform(0.01, 100, (5, 1))).astype(np.float32)
    codec = CODECS[format]
    raw = codec.encode(x)
    _, scales = unpack_row_split(format, as_data(raw), x.shape)
    scale = np.repeat(nm.f16_to_f32(scales), FORMATS[format].group, axis=1)[:, :k]
    err = np.abs(codec.decode(as_data(raw), x.shape) - x)
    assert np.all(err <= scale / 2 * (1 + 2.0**-10))
    assert codec.scan(as_data(raw), x.shape) == []


def test_nf4_encode():
    x = (nm.NF4_CODEBOOK * 2)[None, :].astype(np.float32)
    codes, scales = grouped_absmax(NF4, x)
    assert scales.tolist() == [[0x4000]] and codes.tolist() == [list(range(16))]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 129)).astype(np.float32)
    raw = as_data(CODECS[NF4].encode(x))
    _, scales = unpack_row_split(NF4, raw, x.shape)
    scale = np.repeat(nm.f16_to_f32(scales), 64, axis=1)[:, :129]
    half_gap = np.diff(nm.NF4_CODEBOOK.astype(np.float64)).max() / 2
    assert np.all(np.abs(CODECS[NF4].decode(raw, x.shape) - x) <= scale * half_gap * 1.001)
    zero_codes, zero_scales = grouped_absmax(NF4, np.zeros((1, 3)))
    assert zero_codes.tolist() == [[7, 7, 7]] and zero_scales.tolist() == [[0]]


def test_zero_groups_get_zero_scale():
    x = np.zeros((2, 130), np.float32)
    x[1, 70] = -3.0
    codes, scales = grouped_absmax(Q8, x)
    assert scales[0].tolist() == [0, 0, 0, 0, 0] and scales[1, 2] != 0
    assert codes[1, 70] == -127 and np.count_nonzero(codes) == 1


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e39])
def test_encode_rejects_non_finite(bad):
    with pytest.raises(CodecError, match="non-finite"):
        CODECS[Q4].encode(np.array([[1.0, bad]]))


def test_encode_rejects_scale_overflow():
    with pytest.raises(CodecError, match="overflows binary16"):
        CODECS[Q4].encode(np.array([[1e6]], np.float32))


# --- scan -----------------------------------------------------------------------------------


def scan_messages(format: str, raw: np.ndarray, shape) -> list[tuple[str, str]]:
    return [(f.severity, f.message) for f in CODECS[format].scan(raw, shape)]


@pytest.mark.parametrize(
    ("word", "text"),
    [(0x7C00, "Inf or NaN"), (0xFE00, "Inf or NaN"), (0x8000, "-0 (0x8000)")],
)
def test_scan_invalid_scale_words(word, text):
    codes, scales = random_codes(Q4, (2, 130), seed=1)
    scales[1, 2] = word
    found = scan_messages(Q4, as_data(pack_row_split(Q4, codes, scales)), (2, 130))
    assert found == [("error", found[0][1])]
    assert text in found[0][1] and "row 1 group 2" in found[0][1]


def test_scan_codes_under_zero_scale():
    codes = np.zeros((2, 64), np.int8)
    codes[1, 5:8] = 3
    raw = as_data(pack_row_split(Q6, codes, np.array([[ONE], [0]], np.uint16)))
    [(severity, message)] = scan_messages(Q6, raw, (2, 64))
    assert severity == "error" and "scale is +0" in message and "row 1 group 0 (3)" in message
    nf4 = as_data(pack_row_split(NF4, np.array([[7, 8]]), np.array([[0]], np.uint16)))
    assert [s for s, _ in scan_messages(NF4, nf4, (1, 2))] == ["error"]


def test_scan_q8_code_0x80():
    raw = as_data(pack_row_split(Q8, np.array([[1, 2, 3]]), np.array([[ONE]], np.uint16)))
    raw[1] = 0x80
    [(severity, message)] = scan_messages(Q8, raw, (1, 3))
    assert severity == "error" and "0x80" in message
    raw[1], raw[3] = 2, 0x80  # lane 3 is padding: only a warning
    [(severity, message)] = scan_messages(Q8, raw, (1, 3))
    assert severity == "warning" and "non-zero padding" in message


def test_scan_padding_warnings_q5():
    clean = as_data(pack_row_split(Q5, *random_codes(Q5, (2, 130), seed=9)))
    cases = {
        32 * 2 + 1: "lanes at columns >= 130",  # pad lanes 130/131 of row 0
        32 * 3: "lanes at columns >= 130",  # wholly padded group 3 of row 0
        256 + 8 * 6 + 7: "lanes at columns >= 130",  # high bits of row 1 group 2 pad lanes
        512 + 2 * 7: "wholly padded groups",  # scale of row 1 group 3
        400: "gap after the high-bit plane",
    }
    for offset, text in cases.items():
        raw = clean.copy()
        raw[offset] = 0x10
        found = scan_messages(Q5, raw, (2, 130))
        assert len(found) == 1 and found[0][0] == "warning", (offset, found)
        assert "non-zero padding" in found[0][1] and text in found[0][1]


def test_scan_summarizes_many_findings():
    codes, scales = random_codes(Q4, (50, 256), seed=4)
    scales[:, :] = 0x7C00
    [(severity, message)] = scan_messages(Q4, as_data(pack_row_split(Q4, codes, scales)), (50, 256))
    assert severity == "error" and "200 groups" in message and "and 196 more" in message
    assert len(message) < 300


def test_wrong_length():
    for method in (CODECS[Q4].decode, CODECS[Q4].scan):
        with pytest.raises(CodecError, match="must be 17408 bytes, got 17407"):
            method(np.zeros(17407, np.uint8), (256, 128))


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(list(FORMATS)),
    st.integers(1, 3),
    st.sampled_from(AWKWARD_K),
    st.integers(0, 2**32 - 1),
)
def test_any_bytes_decode_and_scan_without_crashing(format, n, k, seed):
    codec = CODECS[format]
    raw = np.random.default_rng(seed).integers(0, 256, codec.encoded_size((n, k)), np.uint8)
    assert codec.decode(raw, (n, k)).shape == (n, k)
    for finding in codec.scan(raw, (n, k)):
        assert finding.severity in ("error", "warning")
