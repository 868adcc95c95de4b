"""The reference encoder of ``row_split_k128_v1``: spec 3.2 ``grouped_absmax``.

q formats scale each group by its absmax over ``qmax`` and round; nf4 scales by the absmax
and takes the nearest codebook level. Rows are quantized in slices to bound the temporaries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..numeric import f16_to_f32, f32_to_f16, nf4_nearest
from .direct import codec_error

if TYPE_CHECKING:
    from .row_split import RowSplitCodec

# Rows are quantized in slices of about this many values, to bound the encoder's temporaries.
_ENCODE_CHUNK_VALUES = 1 << 22


def absmax_codes(
    codec: RowSplitCodec, values: np.ndarray, divisors: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Codes ``[N, K]`` and binary16 scale words ``[N, ceil(K/G)]`` of ``values``."""
    x = _finite_f32(codec, values)
    geo = codec.geometry(x.shape, divisors)
    codes = np.empty((geo.rows, geo.columns), dtype=np.uint8 if codec.spec.nf4 else np.int8)
    scales = np.empty((geo.rows, geo.real_groups), dtype=np.uint16)
    step = max(1, _ENCODE_CHUNK_VALUES // geo.columns)
    for start in range(0, geo.rows, step):
        rows = slice(start, start + step)
        codes[rows], scales[rows] = _absmax_rows(codec, x[rows], geo.real_groups)
    return codes, scales


def _finite_f32(codec: RowSplitCodec, values: np.ndarray) -> np.ndarray:
    values = np.asarray(values)
    if not (np.issubdtype(values.dtype, np.floating) or np.issubdtype(values.dtype, np.integer)):
        raise codec_error(codec, f"cannot encode values of dtype {values.dtype}")
    with np.errstate(over="ignore"):
        x = values.astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise codec_error(codec, "cannot encode non-finite values (or values beyond float32)")
    return x


def _absmax_rows(
    codec: RowSplitCodec, x: np.ndarray, real_groups: int
) -> tuple[np.ndarray, np.ndarray]:
    fmt = codec.spec
    rows, columns = x.shape
    padded = np.zeros((rows, real_groups * fmt.group), dtype=np.float32)
    padded[:, :columns] = x  # zeros never change a group's absmax
    groups = padded.reshape(rows, real_groups, fmt.group)
    amax = np.abs(groups).max(axis=2)
    if fmt.nf4:
        words = f32_to_f16(amax)
    else:
        words = f32_to_f16((amax.astype(np.float64) / fmt.qmax).astype(np.float32))
    words[(words == 0) & (amax > 0)] = 0x0001  # underflow rescue: 2^-24
    if np.any(words == 0x7C00):
        raise codec_error(codec, "a group's scale overflows binary16 (absmax too large)")
    scale = f16_to_f32(words)
    with np.errstate(divide="ignore"):
        inv = np.where(words == 0, np.float32(0), np.float32(1) / scale)
    y = groups * inv[:, :, None]  # reciprocal-then-multiply is normative
    if fmt.nf4:
        return nf4_nearest(y).reshape(rows, -1)[:, :columns], words
    codes = np.clip(np.rint(y), fmt.qmin, fmt.qmax).astype(np.int8)
    return codes.reshape(rows, -1)[:, :columns], words
