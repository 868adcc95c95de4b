"""Encoded safetensors words decoded to float32, as the artifact codecs decode them: the
report's and ``verify``'s reference, and the values a cast from a quantized checkpoint reads."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ninfer_format.numeric import E2M1_VALUES, E4M3FN_VALUES

from ..block_fp8 import block_size, decode_block_fp8
from ..sources import GgufSource
from .fields import (
    FP8,
    NVFP4_BLOCK,
    Fields,
    detect_fields,
    divisor_values,
    row_scale_values,
    stored_words,
    weight_names,
)


def decode_nvfp4(packed: np.ndarray, scales: np.ndarray, divisor: np.ndarray) -> np.ndarray:
    """``e2m1(c) * e4m3(s) / d`` in float32, as the nvfp4 codec computes it.

    ``packed`` is ``[..., rows, K/2]`` bytes (low nibble first), ``scales`` ``[..., rows, K/16]``,
    ``divisor`` broadcasts against ``[..., rows, 1]``.
    """
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    blocks = codes.reshape(*codes.shape[:-1], -1, NVFP4_BLOCK)
    with np.errstate(all="ignore"):
        values = E2M1_VALUES[blocks] * E4M3FN_VALUES[scales][..., None]
        values = values / np.asarray(divisor, dtype=np.float32)[..., None, None]
    return values.reshape(codes.shape).astype(np.float32)


def decode_fp8(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``e4m3(c) * s`` in float32 with the source's own row scale (F32 or BF16 values)."""
    with np.errstate(all="ignore"):
        return E4M3FN_VALUES[codes] * np.asarray(scale, dtype=np.float32)[..., None]


class DecodedView:
    """A safetensors source seen as float tensors under unquantized names (``P.weight``).

    Encoded matrices decode to float32 exactly as the artifact codec would decode the same
    words; plain tensors pass through. Used to cast from a quantized checkpoint, for the
    conversion report's error of imported parameters, and by ``verify``.
    """

    def __init__(self, source: Any) -> None:
        self.source = source
        self.id = source.id
        self._names = set(source.keys())
        self._keys = weight_names(source)
        self._cache: tuple[str, torch.Tensor] | None = None

    def keys(self) -> list[str]:
        return sorted(self._keys)

    def __contains__(self, name: object) -> bool:
        return name in self._keys

    def fields(self, name: str) -> Fields | None:
        return detect_fields(self.source, self._names, name, decoding=True)

    def load(self, name: str) -> torch.Tensor:
        if self._cache is not None and self._cache[0] == name:
            return self._cache[1]
        fields = self.fields(name)
        if fields is None:
            return self.source.load(name)
        values = torch.from_numpy(self._decode(fields))
        self._cache = (name, values)  # the adapter reads one tensor once per piece
        return values

    def _decode(self, fields: Fields) -> np.ndarray:
        codes = stored_words(self.source, fields.codes)
        if fields.kind == "fp8-block":
            multipliers = self.source.load(fields.scales).to(torch.float32).numpy()
            block = block_size(self.source)
            flat = codes.reshape(-1, codes.shape[-1])
            values = decode_block_fp8(flat, multipliers, block, f"{self.id}: {fields.scales}")
            return values.reshape(codes.shape)
        if fields.format == FP8:
            rows = codes.reshape(-1, codes.shape[-1]).shape[0]
            scale = row_scale_values(self.source, fields, rows)
            return decode_fp8(codes.reshape(rows, -1), scale).reshape(codes.shape)
        scales = stored_words(self.source, fields.scales)
        divisor = divisor_values(self.source, fields.divisor, fields.reciprocal, "a weight divisor")
        if divisor.size > 1:  # fused bank [E, N, K/2]: one divisor per expert
            divisor = divisor.reshape(-1, *([1] * (codes.ndim - 2)))
        return decode_nvfp4(codes, scales, divisor[..., 0] if divisor.size == 1 else divisor)


def values_view(source: Any) -> Any:
    """How the converter reads float values from a source: decoded if it is safetensors."""
    return source if isinstance(source, GgufSource) else DecodedView(source)
