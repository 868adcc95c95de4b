"""Where an encoded matrix lives in a safetensors source (notes 2.6 field table), and its
fields' stored words read as they are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import RecipeError

NVFP4 = "nvfp4"
FP8 = "fp8_e4m3fn_row_bf16"
NVFP4_BLOCK = 16
_PACKED, _SCALE, _GLOBAL, _SCALE_2, _SCALE_INV = (
    "_packed",
    "_scale",
    "_global_scale",
    "_scale_2",
    "_scale_inv",
)


def _input_name(weight: str, suffix: str) -> str:
    """``P.weight`` -> ``P.input_scale``; fused ``X.up_proj`` -> ``X.up_proj_input_scale``."""
    if weight.endswith(".weight"):
        return f"{weight[: -len('.weight')]}.{suffix}"
    return f"{weight}_{suffix}"


@dataclass(frozen=True)
class Fields:
    """Where one encoded matrix lives in a safetensors source (notes 2.6 field table)."""

    kind: str  # "nvfp4-ct", "nvfp4-modelopt", "fp8-row", "fp8-tensor", "fp8-block"
    weight: str  # the unquantized name the adapter uses (``P.weight``)
    codes: str
    scales: str
    divisor: str | None = None  # NVFP4 weight divisor (as is, or the reciprocal: ModelOpt)
    activation: str | None = None  # input divisor (as is, or the reciprocal: ModelOpt)

    @property
    def format(self) -> str:
        return NVFP4 if self.kind.startswith("nvfp4") else FP8

    @property
    def reciprocal(self) -> bool:
        """ModelOpt stores multipliers (``weight_scale_2``, ``input_scale``): divisor = 1/x."""
        return self.kind == "nvfp4-modelopt"


def detect_fields(
    source: Any, names: set[str], weight: str, *, decoding: bool = False
) -> Fields | None:
    """The encoding of ``weight`` in ``source`` (detection order of notes 2.6), None if plain.
    Block FP8 is only found when ``decoding`` (its words cannot be imported)."""
    if weight + _SCALE_INV in names and decoding:
        return Fields("fp8-block", weight, weight, weight + _SCALE_INV)
    if weight + _SCALE_INV in names:
        raise RecipeError(
            f"{source.id}: {weight} is block-FP8 ({weight + _SCALE_INV}); its words cannot be "
            "imported (decode it and re-quantize instead)"
        )
    if weight + _PACKED in names:
        return Fields(
            "nvfp4-ct",
            weight,
            weight + _PACKED,
            weight + _SCALE,
            weight + _GLOBAL,
            _present(names, _input_name(weight, "input_global_scale")),
        )
    if weight not in names:
        return None
    dtype = source.dtype(weight)
    if dtype == "U8":
        return Fields(
            "nvfp4-modelopt",
            weight,
            weight,
            weight + _SCALE,
            weight + _SCALE_2,
            _present(names, _input_name(weight, "input_scale")),
        )
    if dtype == "F8_E4M3":
        scale = weight + _SCALE
        per_tensor = scale in names and np.prod(source.shape(scale), dtype=np.int64) == 1
        return Fields("fp8-tensor" if per_tensor else "fp8-row", weight, weight, scale)
    return None


def _present(names: set[str], name: str) -> str | None:
    return name if name in names else None


def weight_names(source: Any) -> set[str]:
    """The source's tensor names plus ``P.weight`` for every compressed-tensors
    ``P.weight_packed``: the names an adapter for unquantized checkpoints looks for."""
    names = set(source.keys())
    return names | {n[: -len(_PACKED)] for n in names if n.endswith(_PACKED)}


def stored_words(source: Any, name: str) -> np.ndarray:
    """A tensor's stored words as unsigned integers (bytes for U8/F8, u16 for BF16)."""
    t = source.load(name)
    if t.dtype in (torch.float8_e4m3fn, torch.uint8, torch.int8):
        return t.view(torch.uint8).numpy()
    if t.dtype in (torch.bfloat16, torch.float16, torch.int16):
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype in (torch.float32, torch.int32):
        return t.view(torch.int32).numpy().view(np.uint32)
    raise RecipeError(f"{source.id}: {name} has dtype {t.dtype}, not an encoded field")


def require_field(source: Any, name: str | None, dtypes: tuple[str, ...], what: str) -> str:
    if name is None or name not in source:
        raise RecipeError(f"{source.id}: {what} {name} is missing")
    dtype = source.dtype(name)
    if dtype not in dtypes:
        raise RecipeError(
            f"{source.id}: {name} ({what}) is {dtype}, expected {' or '.join(dtypes)}"
        )
    return name


def divisor_values(source: Any, name: str, reciprocal: bool, what: str) -> np.ndarray:
    """A divisor field as float32 values (``f32(1/x)`` for ModelOpt multipliers), checked
    finite and > 0; one value, or one per expert of a fused bank."""
    values = source.load(name).to(torch.float32).reshape(-1).numpy().astype(np.float32)
    if reciprocal:
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            values = np.float32(1) / values
    bad = ~(np.isfinite(values) & (values > 0))
    if bad.any():
        raise RecipeError(
            f"{source.id}: {name} gives {what} {values[bad][0]!r}; it must be finite and > 0"
        )
    return values


def row_scale_values(source: Any, fields: Fields, rows: int) -> np.ndarray:
    """FP8 row scales as float32 values ``[rows]`` (a per-tensor scalar repeated)."""
    values = source.load(fields.scales).to(torch.float32).reshape(-1).numpy()
    return np.full(rows, values[0], np.float32) if values.size == 1 else values
