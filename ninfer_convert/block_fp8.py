"""Block-FP8 checkpoints (DeepSeek/GLM ``weight`` F8_E4M3 + ``weight_scale_inv``): values only.

Each ``[block_rows, block_columns]`` tile of E4M3FN codes shares one float multiplier
(``weight_scale_inv``, ``[ceil(N/bn), ceil(K/bk)]``); the tile size is the checkpoint's
``quantization_config.weight_block_size`` (128 x 128 when it names none). No artifact format
keeps such tiles, so the converter decodes them to float values and re-quantizes; importing
their words is refused (``encoded.detect_fields``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ninfer_format.numeric import E4M3FN_VALUES

from .errors import RecipeError

DEFAULT_BLOCK = (128, 128)


def block_size(source: Any) -> tuple[int, int]:
    """The tile ``(rows, columns)`` of ``source``'s block-FP8 weights."""
    config = getattr(source, "quantization", None) or {}
    block = config.get("weight_block_size", DEFAULT_BLOCK)
    if (
        not isinstance(block, list | tuple)
        or len(block) != 2
        or not all(type(b) is int and b > 0 for b in block)
    ):
        raise RecipeError(
            f"{source.id}: quantization_config weight_block_size must be two positive "
            f"integers, got {block!r}"
        )
    return int(block[0]), int(block[1])


def decode_block_fp8(
    codes: np.ndarray, multipliers: np.ndarray, block: tuple[int, int], name: str
) -> np.ndarray:
    """``e4m3(c) * m[tile]`` in float32 for ``codes`` ``[N, K]`` bytes; ``name`` is the
    multipliers' tensor (errors name it)."""
    rows, columns = codes.shape
    tiles = (math.ceil(rows / block[0]), math.ceil(columns / block[1]))
    if multipliers.shape != tiles:
        raise RecipeError(
            f"{name} has shape {list(multipliers.shape)}; [{rows}, {columns}] codes in "
            f"{block[0]}x{block[1]} tiles need {list(tiles)}"
        )
    scale = np.repeat(np.repeat(multipliers, block[0], axis=0), block[1], axis=1)
    with np.errstate(all="ignore"):
        return (E4M3FN_VALUES[codes] * scale[:rows, :columns]).astype(np.float32)
