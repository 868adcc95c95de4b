"""Bit-level number conversions (spec 3.1, 3.3; notes 2.4, 2.5, 2.7)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer_format import numeric as nm

ALL_U16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
f32_words = st.integers(0, 2**32 - 1)


def words_to_f32(words: list[int]) -> np.ndarray:
    return np.array(words, dtype=np.uint32).view(np.float32)


# --- binary16 ---------------------------------------------------------------------------------


def test_f16_words_round_trip_exactly():
    values = nm.f16_to_f32(ALL_U16)
    back = nm.f32_to_f16(values)
    finite = ~np.isnan(values)
    assert np.array_equal(back[finite], ALL_U16[finite])
    assert np.all(np.isnan(nm.f16_to_f32(back[~finite])))


def test_f16_known_values():
    assert nm.f16_to_f32(np.array([0x3C00, 0x0001, 0x7BFF, 0x8000], np.uint16)).tolist() == [
        1.0,
        2.0**-24,
        65504.0,
        -0.0,
    ]
    # f32 -> f16 rounds to nearest even; 65520 is the first value that overflows.
    assert nm.f32_to_f16(np.float32([1 + 2**-11, 1 + 3 * 2**-11, 65519, 65520])).tolist() == [
        0x3C00,
        0x3C02,
        0x7BFF,
        0x7C00,
    ]


# --- bfloat16 ---------------------------------------------------------------------------------


def test_bf16_words_round_trip_bit_exactly_including_nan_payloads():
    values = nm.bf16_to_f32(ALL_U16)
    assert np.array_equal(values.view(np.uint32), ALL_U16.astype(np.uint32) << 16)
    assert np.array_equal(nm.f32_to_bf16(values), ALL_U16)


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        (0x3F808000, 0x3F80),  # tie, even stays
        (0x3F818000, 0x3F82),  # tie, odd rounds up
        (0x3F808001, 0x3F81),  # above the tie
        (0x3F807FFF, 0x3F80),  # below the tie
        (0x7F7FFFFF, 0x7F80),  # largest float32 rounds to Inf
        (0xFF7FFFFF, 0xFF80),
        (0x80000000, 0x8000),  # -0 keeps its sign
        (0x00000001, 0x0000),  # smallest subnormal rounds to +0
        (0x7F800001, 0x7FC0),  # NaN with low payload only stays NaN (quiet bit)
        (0xFFC12345, 0xFFC1),  # NaN keeps its high payload and sign
    ],
)
def test_f32_to_bf16_rounding(word, expected):
    assert int(nm.f32_to_bf16(words_to_f32([word]))[0]) == expected


@settings(max_examples=300, deadline=None)
@given(f32_words)
def test_f32_to_bf16_is_nearest_even(word):
    x = words_to_f32([word])
    if not np.isfinite(x[0]):
        return
    low = word >> 16
    candidates = [low, low + 1]
    got = int(nm.f32_to_bf16(x)[0])
    assert got in candidates
    exact = float(x[0])
    below = float(nm.bf16_to_f32(np.array([low], np.uint16))[0])
    if (low & 0x7FFF) == 0x7F7F and (word & 0xFFFF) >= 0x8000:
        return  # rounds past the largest finite value, checked above
    above = float(nm.bf16_to_f32(np.array([(low + 1) & 0xFFFF], np.uint16))[0])
    d_below, d_above = abs(exact - below), abs(above - exact)
    if d_below != d_above:
        assert got == (low if d_below < d_above else low + 1)
    else:
        assert got % 2 == 0


# --- E4M3FN ----------------------------------------------------------------------------------


def test_e4m3fn_table():
    table = nm.E4M3FN_VALUES
    assert table.dtype == np.float32 and table.shape == (256,)
    assert table[0x00] == 0 and not np.signbit(table[0x00])
    assert table[0x80] == 0 and np.signbit(table[0x80])
    assert table[0x01] == 2.0**-9 and table[0x07] == 7 * 2.0**-9
    assert table[0x08] == 2.0**-6 and table[0x38] == 1.0
    assert table[0x77] == 240.0 and table[0x78] == 256.0 and table[0x7E] == 448.0
    assert table[0xFE] == -448.0 and table[0xB8] == -1.0
    assert np.isnan(table[0x7F]) and np.isnan(table[0xFF])
    assert np.count_nonzero(np.isnan(table)) == 2
    assert np.all(np.diff(table[:0x7F]) > 0)


def test_e4m3fn_every_finite_code_round_trips():
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    assert np.array_equal(nm.f32_to_e4m3fn(nm.e4m3fn_to_f32(codes)), codes)


def test_e4m3fn_ties_go_to_even_code():
    table = nm.E4M3FN_VALUES[:0x7F].astype(np.float64)
    midpoints = ((table[:-1] + table[1:]) / 2).astype(np.float32)
    assert np.array_equal(midpoints.astype(np.float64), (table[:-1] + table[1:]) / 2)
    got = nm.f32_to_e4m3fn(midpoints).astype(int)
    lower = np.arange(0x7E)
    assert np.array_equal(got, np.where(lower % 2 == 0, lower, lower + 1))
    assert nm.f32_to_e4m3fn(np.float32([2.0**-10, 3 * 2.0**-11, -(2.0**-10)])).tolist() == [
        0x00,
        0x01,
        0x80,
    ]


def test_e4m3fn_saturates_and_keeps_nan():
    got = nm.f32_to_e4m3fn(np.float32([449, 464, 1e30, np.inf, -1e30, np.nan, -np.nan]))
    assert got.tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0xFF]
    assert nm.f32_to_e4m3fn(np.float32([-0.0, 0.0])).tolist() == [0x80, 0x00]


def test_e4m3fn_bit_rounding_agrees_with_threshold_rounding():
    # Two independent roundings over a sweep of ~1M float32 words, every exponent included.
    x = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = x[~np.isnan(x)]
    codes = nm.f32_to_e4m3fn(x)
    grid = nm.E4M3FN_VALUES[:0x7F]
    expected = nm.nearest_level(np.minimum(np.abs(x), np.float32(448)), grid)
    assert np.array_equal(codes & 0x7F, expected)
    assert np.array_equal(codes >> 7, np.signbit(x))


@settings(max_examples=300, deadline=None)
@given(st.floats(-500, 500, width=32))
def test_e4m3fn_matches_brute_force(x):
    magnitude = min(abs(x), 448.0)
    table = nm.E4M3FN_VALUES[:0x7F].astype(np.float64)
    distance = np.abs(table - magnitude)
    best = np.flatnonzero(distance == distance.min())
    code = int(best[0]) if len(best) == 1 else int(best[best % 2 == 0][0])
    code |= 0x80 if np.signbit(x) else 0
    assert int(nm.f32_to_e4m3fn(np.float32([x]))[0]) == code


# --- E2M1 ------------------------------------------------------------------------------------


def test_e2m1_table():
    assert nm.E2M1_VALUES.tolist()[:8] == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert np.array_equal(nm.E2M1_VALUES[8:], -nm.E2M1_VALUES[:8])
    assert np.signbit(nm.E2M1_VALUES[8]) and not np.signbit(nm.E2M1_VALUES[0])


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (0.25, 0),
        (0.2500001, 1),
        (0.75, 2),
        (0.7499999, 1),
        (1.25, 2),
        (1.75, 4),
        (2.5, 4),
        (3.5, 6),
        (5.0, 6),
        (5.0000005, 7),
        (6.0, 7),
        (7.0, 7),
        (1e30, 7),
        (0.0, 0),
        (-0.0, 8),
        (-0.1, 8),
        (-1.75, 12),
        (-100.0, 15),
    ],
)
def test_f32_to_e2m1_thresholds(value, code):
    assert int(nm.f32_to_e2m1(np.float32([value]))[0]) == code


def test_e2m1_every_code_round_trips():
    codes = np.arange(16, dtype=np.uint8)
    assert np.array_equal(nm.f32_to_e2m1(nm.e2m1_to_f32(codes)), codes)


# --- NF4 -------------------------------------------------------------------------------------


def test_nf4_codebook():
    book = nm.NF4_CODEBOOK
    assert book.dtype == np.float32 and book.shape == (16,)
    assert book[0] == -1 and book[15] == 1 and book[nm.NF4_ZERO_CODE] == 0
    assert book[1] == np.float32(-0.6961928009986877)
    assert book[8] == np.float32(0.07958029955625534)
    assert np.all(np.diff(book) > 0)
    assert np.array_equal(nm.nf4_nearest(book), np.arange(16))


def test_nearest_level_ties_to_even_index_and_clamps():
    grid = np.array([0.0, 1.0, 2.0, 3.0])
    assert nm.nearest_level(np.array([0.5, 1.5, 2.5, -5, 9]), grid).tolist() == [0, 2, 2, 0, 3]
    # A midpoint that is no float32: 1 + 2^-23 and 1 + 2^-22 straddle 1 + 1.5 * 2^-23.
    grid = np.float32([1.0, 1 + 2.0**-23, 1 + 2.0**-22])
    values = np.float32([1 + 2.0**-23, 1 + 2.0**-22])
    assert nm.nearest_level(values, grid).tolist() == [1, 2]


@settings(max_examples=200, deadline=None)
@given(st.floats(-1.25, 1.25, width=32))
def test_nf4_nearest_matches_brute_force(x):
    distance = np.abs(nm.NF4_CODEBOOK.astype(np.float64) - x)
    best = np.flatnonzero(distance == distance.min())
    expected = int(best[0]) if len(best) == 1 else int(best[best % 2 == 0][0])
    assert int(nm.nf4_nearest(np.float32([x]))[0]) == expected
