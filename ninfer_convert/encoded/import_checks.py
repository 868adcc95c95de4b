"""``import_encoded``'s checks of a source: field dtypes and shapes and the rows the pieces
select (from the header, before writing), and code and scale words (as each parent is read).
Every error names the source tensor at fault."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..adapters import LogicalTensor, SourcePiece
from ..errors import RecipeError
from .fields import FP8, NVFP4_BLOCK, Fields, require_field


def expert_index(source: Any, f: Fields, piece: SourcePiece) -> int:
    """Which expert of a fused rank-3 bank a piece reads (0 for an ordinary matrix)."""
    shape = source.shape(f.codes)
    if len(shape) < 3 or piece.rows is None:
        return 0
    per = shape[-2]
    first, last = piece.rows[0] // per, (piece.rows[1] - 1) // per
    if first != last:
        raise RecipeError(f"{source.id}: rows {piece.rows} of {f.codes} span two experts")
    return first


def check_header(source: Any, f: Fields, tensor: LogicalTensor) -> None:
    """Dtypes and shapes of every field, from the safetensors header alone."""
    k = tensor.shape[-1]
    if f.format == FP8:
        require_field(source, f.codes, ("F8_E4M3",), "FP8 codes")
        require_field(source, f.scales, ("BF16", "F32"), "FP8 row scale")
        shape, scale = source.shape(f.codes), source.shape(f.scales)
        per_row = scale in (shape[:-1], (*shape[:-1], 1))
        if shape[-1] != k or not (per_row or int(np.prod(scale, dtype=np.int64)) == 1):
            raise RecipeError(
                f"{source.id}: {f.codes} {list(shape)} / {f.scales} {list(scale)} do not hold "
                f"FP8 rows of {k} values with one scale per row (or per tensor)"
            )
        return
    require_field(source, f.codes, ("U8",), "NVFP4 codes")
    require_field(source, f.scales, ("F8_E4M3",), "NVFP4 block scales")
    require_field(source, f.divisor, ("F32",), "NVFP4 weight divisor")
    if f.activation is not None:
        require_field(source, f.activation, ("F32",), "activation divisor")
    shape, scale = source.shape(f.codes), source.shape(f.scales)
    if shape[-1] * 2 != k or scale != (*shape[:-1], k // NVFP4_BLOCK):
        raise RecipeError(
            f"{source.id}: {f.codes} {list(shape)} / {f.scales} {list(scale)} do not hold "
            f"NVFP4 rows of {k} values ([rows, {k // 2}] codes, [rows, {k // NVFP4_BLOCK}] "
            "scales)"
        )
    experts = shape[0] if len(shape) >= 3 else 1
    for name in (f.divisor, f.activation):
        if name is not None and int(np.prod(source.shape(name), dtype=np.int64)) not in (
            1,
            experts,
        ):
            raise RecipeError(
                f"{source.id}: {name} has shape {list(source.shape(name))}; expected one value"
                + (f" or one per expert ({experts})" if experts > 1 else "")
            )


def check_rows(source: Any, fields: dict[str, Fields], tensor: LogicalTensor) -> None:
    """The pieces select existing rows, as many as the parameter has."""
    total = 0
    for piece in tensor.pieces:
        f = fields[piece.tensor]
        rows = int(np.prod(source.shape(f.codes)[:-1], dtype=np.int64))
        start, stop = piece.rows if piece.rows is not None else (0, rows)
        if stop > rows:
            raise RecipeError(
                f"{source.id}: {f.codes} has {rows} rows; {tensor.name} needs rows up to {stop}"
            )
        total += stop - start
    if total != tensor.shape[0]:
        raise RecipeError(
            f"{source.id}: {', '.join(fields)} give {total} rows for {tensor.name}, "
            f"which has {tensor.shape[0]}"
        )


def _where(mask: np.ndarray) -> str:
    index = tuple(int(i) for i in np.argwhere(mask)[0])
    return f"{int(mask.sum())} word(s), first at {list(index)}"


def check_nvfp4_scales(source: Any, name: str, scales: np.ndarray) -> None:
    bad = (scales >= 0x80) | (scales == 0x7F)
    if bad.any():
        raise RecipeError(
            f"{source.id}: {name} holds invalid E4M3FN block scales (sign bit set or NaN 0x7F): "
            + _where(bad)
        )


def check_fp8_words(source: Any, f: Fields, codes: np.ndarray, scales: np.ndarray) -> None:
    nan = (codes & 0x7F) == 0x7F
    if nan.any():
        raise RecipeError(f"{source.id}: {f.codes} holds NaN E4M3FN codes: {_where(nan)}")
    bad = ~np.isfinite(scales) | (scales < 0) | np.signbit(scales)
    if bad.any():
        raise RecipeError(
            f"{source.id}: {f.scales} holds negative or non-finite row scales: {_where(bad)}"
        )
    zero_rows = scales == 0
    if zero_rows.any() and ((codes[zero_rows] & 0x7F) != 0).any():
        raise RecipeError(f"{source.id}: {f.codes} has non-zero codes in rows whose scale is 0")
