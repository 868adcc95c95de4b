"""``cast``: direct formats bf16, fp32, int32 in ``contiguous_le_v1`` (spec 3.1, notes 2.8).

bf16 sources are copied word for word; anything else goes through float32 (exact for fp16,
RNE for fp64) and is rounded to bfloat16 with integer arithmetic on the bit pattern, which is
RNE without any flush-to-zero and the same on every device (the bytes equal the numpy codec's).
int32 takes integers in range or floats that are whole numbers; nothing is truncated silently.

Non-finite floats are refused unless ``allow_non_finite=True``: a NaN or Inf in a weight is
almost always a broken checkpoint, but a recipe may knowingly keep e.g. a -inf mask; then
bf16/fp32 keep it bit-exactly (bf16 NaN payloads as ``numeric.f32_to_bf16`` does).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import RecipeError
from . import _common as common

CAST_FORMATS = ("bf16", "fp32", "int32")
_WORD = {"bf16": np.dtype("<u2"), "fp32": np.dtype("<u4"), "int32": np.dtype("<u4")}
_INT_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def cast(values: torch.Tensor, format: str, *, allow_non_finite: bool = False) -> bytes:
    if any(d == 0 for d in values.shape):
        raise RecipeError(f"{format}: needs every dimension > 0, got shape {list(values.shape)}")
    if values.dim() > 16:
        raise RecipeError(f"{format}: needs rank <= 16, got rank {values.dim()}")
    flat = values.reshape(-1)
    out = np.empty(flat.numel() * _WORD[format].itemsize, dtype=np.uint8)
    step = common.chunk_values(values.device)
    for start in range(0, flat.numel(), step):
        chunk = flat[start : start + step]
        words = (
            _int32(chunk, start)
            if format == "int32"
            else _float(chunk, format, start, allow_non_finite)
        )
        width = _WORD[format].itemsize
        out[start * width : (start + chunk.numel()) * width] = common.host(words).view(np.uint8)
    return out.tobytes()


def _float(chunk: torch.Tensor, format: str, start: int, allow_non_finite: bool) -> torch.Tensor:
    if chunk.dtype not in common.FLOAT_DTYPES and chunk.dtype not in _INT_DTYPES:
        raise RecipeError(f"{format}: cannot cast values of dtype {chunk.dtype}")
    if format == "bf16" and chunk.dtype == torch.bfloat16:
        if not allow_non_finite:
            _check_finite(chunk, start)
        return chunk.contiguous().view(torch.int16)
    x = chunk.to(torch.float32).contiguous()
    if not allow_non_finite:
        _check_finite(x, start, chunk)
    return common.bf16_words(x) if format == "bf16" else x.view(torch.int32)


def _check_finite(x: torch.Tensor, start: int, source: torch.Tensor | None = None) -> None:
    finite = torch.isfinite(x)
    if bool(finite.all()):
        return
    flat = start + int(torch.argmin(finite.to(torch.uint8)))
    value = float((x if source is None else source)[flat - start])
    if math.isfinite(value):
        raise RecipeError(f"value {value!r} at flat index {flat} is beyond the float32 range")
    raise RecipeError(
        f"non-finite value {value} at flat index {flat} (allow_non_finite=True keeps it)"
    )


def _int32(chunk: torch.Tensor, start: int) -> torch.Tensor:
    """Integers must fit; floats must be finite whole numbers (no silent truncation)."""
    if chunk.dtype in _INT_DTYPES:
        if chunk.dtype == torch.int64 and chunk.numel():
            low, high = int(chunk.min()), int(chunk.max())
            if low < -(2**31) or high > 2**31 - 1:
                raise RecipeError(f"int32: values outside the int32 range ({low}..{high})")
        return chunk.to(torch.int32).contiguous()
    if chunk.dtype not in common.FLOAT_DTYPES:
        raise RecipeError(f"int32: cannot cast values of dtype {chunk.dtype}")
    x = chunk.to(torch.float64)
    _check_finite(x, start)
    fractional = torch.trunc(x) != x
    if bool(fractional.any()):
        flat = start + int(torch.argmax(fractional.to(torch.uint8)))
        raise RecipeError(
            f"int32: non-integer value {float(x[flat - start])!r} at flat index {flat}"
        )
    low, high = float(x.min()), float(x.max())
    if low < -(2**31) or high > 2**31 - 1:
        raise RecipeError(f"int32: values outside the int32 range ({low:.0f}..{high:.0f})")
    return x.to(torch.int32)
