"""Bit-exact conversions between the artifact's small number formats and float32.

Every function works on whole numpy arrays: the codecs call them on tensors with hundreds of
millions of elements, so nothing here loops over elements in Python. Words travel as unsigned
integer arrays (``uint16`` for binary16/bfloat16, ``uint8`` for E4M3FN bytes and E2M1 nibbles)
because numpy has no bfloat16 or 8-bit float dtypes, and because an integer view is the only
way to keep NaN payloads and -0 exactly as stored.

Rounding is always round-to-nearest, ties-to-even (spec section 3; notes 2.1, 2.4, 2.5).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "E2M1_VALUES",
    "E4M3FN_MAX",
    "E4M3FN_VALUES",
    "NF4_CODEBOOK",
    "NF4_ZERO_CODE",
    "bf16_to_f32",
    "e2m1_to_f32",
    "e4m3fn_to_f32",
    "f16_to_f32",
    "f32_to_bf16",
    "f32_to_e2m1",
    "f32_to_e4m3fn",
    "f32_to_f16",
    "nearest_level",
    "nf4_nearest",
]


# --- binary16 -------------------------------------------------------------------------------


def f16_to_f32(words: np.ndarray) -> np.ndarray:
    """binary16 words -> float32 (exact; every binary16 value is a float32 value)."""
    return np.asarray(words, dtype=np.uint16).view(np.float16).astype(np.float32)


def f32_to_f16(values: np.ndarray) -> np.ndarray:
    """float32 -> binary16 words, RNE, overflow to Inf.

    Input is rounded to float32 first: the reference encoders round f64 -> f32 -> f16 on
    purpose (notes 2.1), and numpy's direct float64 -> float16 cast would round only once.
    """
    with np.errstate(over="ignore"):  # overflow to Inf is the defined result
        return np.asarray(values, dtype=np.float32).astype(np.float16).view(np.uint16)


# --- bfloat16 -------------------------------------------------------------------------------


def bf16_to_f32(words: np.ndarray) -> np.ndarray:
    """bfloat16 words -> float32: the word becomes the high half, the low half is zero."""
    wide = np.asarray(words, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
    return wide.view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 words, RNE; NaN stays NaN with its high payload bits.

    Integer arithmetic on the bit pattern rather than float ops: it is exact, cannot be
    flushed to zero by the FPU, and the uint32 sum cannot wrap for any finite input or Inf.
    A NaN whose payload lives only in the low half would truncate to Inf, so it gets the quiet
    bit; any NaN that came from a bfloat16 word keeps that word exactly.
    """
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    high = bits >> np.uint32(16)
    is_nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    nan_word = np.where((high & np.uint32(0x7F)) == 0, high | np.uint32(0x40), high)
    return np.where(is_nan, nan_word, rounded).astype(np.uint16)


# --- E4M3FN ---------------------------------------------------------------------------------


def _e4m3fn_table() -> np.ndarray:
    word = np.arange(256, dtype=np.uint32)
    exponent = ((word >> 3) & 0xF).astype(np.int32)
    mantissa = (word & 0x7).astype(np.float64)
    magnitude = np.where(
        exponent == 0,
        mantissa * 2.0**-9,
        (1.0 + mantissa / 8.0) * np.exp2(exponent.astype(np.float64) - 7.0),
    )
    magnitude[(word & 0x7F) == 0x7F] = np.nan
    sign = np.where(word & 0x80, -1.0, 1.0)
    table = (sign * magnitude).astype(np.float32)
    table[0x80] = np.float32(-0.0)
    table.setflags(write=False)
    return table


#: value of every E4M3FN byte (0x7F and 0xFF are NaN)
E4M3FN_VALUES: np.ndarray = _e4m3fn_table()
E4M3FN_MAX = 448.0


def e4m3fn_to_f32(codes: np.ndarray) -> np.ndarray:
    return np.take(E4M3FN_VALUES, np.asarray(codes, dtype=np.uint8))


def f32_to_e4m3fn(values: np.ndarray) -> np.ndarray:
    """float32 -> E4M3FN bytes: nearest value, ties to the even code word, sign from signbit.

    Magnitudes above 448 saturate to 448 (0x7E): both reference encoders clamp before
    rounding (spec 3.4, notes 2.5), and the format has no infinity to overflow into.
    NaN becomes the NaN word 0x7F (with its sign).

    Normal results come from rounding the float32 bit pattern to 3 fraction bits (RNE on the
    pattern is RNE on the value, and a carry into the exponent is the right answer); below
    2^-6 the codes are the multiples of 2^-9, so the code is ``rint(|x| * 512)``.
    """
    x = np.asarray(values, dtype=np.float32)
    magnitude = np.minimum(np.abs(x), np.float32(E4M3FN_MAX))
    bits = magnitude.view(np.uint32)
    carry = bits + np.uint32(0x7FFFF) + ((bits >> np.uint32(20)) & np.uint32(1))
    normal = (carry >> np.uint32(20)).astype(np.int32) - ((127 - 7) << 3)
    with np.errstate(invalid="ignore"):  # NaN lanes are replaced below
        subnormal = np.rint(magnitude * np.float32(512)).astype(np.int32)
    code = np.where(magnitude >= np.float32(2.0**-6), normal, subnormal).astype(np.uint8)
    code = np.where(np.isnan(x), np.uint8(0x7F), code)
    return code | (np.signbit(x).astype(np.uint8) << np.uint8(7))


# --- E2M1 -----------------------------------------------------------------------------------

#: value of every E2M1 nibble; bit 3 is the sign, 0x8 is -0
E2M1_VALUES: np.ndarray = np.array(
    [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32
)
E2M1_VALUES.setflags(write=False)

# Rounding boundaries between neighbouring magnitudes. "Strict" ones are passed only when the
# value is above them, so an exact midpoint stays on the even code below (0, 1.0, 2, 4);
# the others are passed on equality, so the midpoint goes up to the even code (1.0, 2, 4).
_E2M1_ABOVE = np.array([0.25, 1.25, 2.5, 5.0], dtype=np.float32)
_E2M1_AT_LEAST = np.array([0.75, 1.75, 3.5], dtype=np.float32)


def e2m1_to_f32(nibbles: np.ndarray) -> np.ndarray:
    return np.take(E2M1_VALUES, np.asarray(nibbles, dtype=np.uint8) & np.uint8(0xF))


def f32_to_e2m1(values: np.ndarray) -> np.ndarray:
    """float32 -> E2M1 nibbles with the threshold rule of notes 2.5 (ties to even, > 6 -> 6)."""
    x = np.asarray(values, dtype=np.float32)
    magnitude = np.abs(x)
    code = np.zeros(x.shape, dtype=np.uint8)
    for bound in _E2M1_ABOVE:
        code += magnitude > bound
    for bound in _E2M1_AT_LEAST:
        code += magnitude >= bound
    return code | (np.signbit(x).astype(np.uint8) << np.uint8(3))


# --- NF4 ------------------------------------------------------------------------------------

#: QLoRA normal-float levels, index = stored nibble (project decision 4)
NF4_CODEBOOK: np.ndarray = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    dtype=np.float32,
)
NF4_CODEBOOK.setflags(write=False)
#: the code whose level is 0: padding lanes and all-zero groups
NF4_ZERO_CODE = 7


def nf4_nearest(values: np.ndarray) -> np.ndarray:
    """float32 (normally in [-1, 1]) -> index of the nearest NF4 level, ties to the even index."""
    return nearest_level(values, NF4_CODEBOOK)


# --- shared rounding ------------------------------------------------------------------------


def nearest_level(values: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Index (uint8) of the nearest of the increasing float32 ``levels`` (at most 256); a tie
    picks the even index. Values are rounded to float32 and clamp to the first/last index.

    Each midpoint between two levels becomes a float32 threshold that a float32 value must
    *exceed* to pass it, so rounding, ties included, needs no float64 copy of a large tensor
    and suffers no midpoint rounding error. For a codebook as small as NF4's, counting the
    thresholds passed is several times faster than ``searchsorted``.
    """
    x = np.asarray(values, dtype=np.float32)
    thresholds = _pass_thresholds(levels)
    if len(thresholds) > 16:
        return np.searchsorted(thresholds, x, side="left").astype(np.uint8)
    index = np.zeros(x.shape, dtype=np.uint8)
    passed = np.empty(x.shape, dtype=np.bool_)
    for threshold in thresholds:
        np.greater(x, threshold, out=passed)
        index += passed
    return index


def _pass_thresholds(levels: np.ndarray) -> np.ndarray:
    grid = np.asarray(levels, dtype=np.float32).astype(np.float64)
    midpoint = (grid[:-1] + grid[1:]) / 2  # exact in float64
    nearest = midpoint.astype(np.float32)
    below = np.nextafter(nearest, np.float32(-np.inf))
    # A value passes midpoint i (between indices i and i+1) when it is above the midpoint, or
    # on it and i+1 is even. When the midpoint is not a float32, the first float32 above it is
    # the first to pass; "x >= t" is "x > the float32 just below t".
    tie_goes_up = np.arange(1, len(grid)) % 2 == 0
    exact = nearest.astype(np.float64) == midpoint
    rounded_up = nearest.astype(np.float64) > midpoint
    return np.where((exact & tie_goes_up) | (~exact & rounded_up), below, nearest)
