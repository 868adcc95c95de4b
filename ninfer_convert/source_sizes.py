"""Source tensors against the parameters the config says they hold, before anything is written.

An adapter chooses source tensors and rows from the config alone; when the checkpoint's tensors
have other shapes (a config that does not describe these weights: a wrong latent rank, head
count or width), loading would only notice mid-conversion, after the writer opened. Checked
here for parameters read as plain float tensors (encoded ones are checked by their importer).
"""

from __future__ import annotations

import math
from typing import Any

from .adapters import LogicalTensor, SourcePiece
from .errors import SourceError


def piece_values(shape: tuple[int, ...], piece: SourcePiece) -> int:
    """Values ``LogicalTensor.load`` takes from a tensor of ``shape`` (rows past its end:
    none)."""
    if piece.rows is None:
        return math.prod(shape)
    width = shape[-1] if len(shape) > 1 else 1
    rows = math.prod(shape) // width if width else 0
    start, stop = (min(r, rows) for r in piece.rows)
    return max(stop - start, 0) * width


def _describe(source: Any, piece: SourcePiece) -> str:
    rows = f" rows {piece.rows[0]}:{piece.rows[1]} of" if piece.rows is not None else ""
    return f"{rows} {piece.tensor} {list(source.shape(piece.tensor))}"


def check_sizes(source: Any, tensor: LogicalTensor) -> None:
    """``tensor`` gets exactly its element count from ``source``'s plain tensors; a
    ``SourceError`` naming the tensors, their shapes and the parameter otherwise."""
    if tensor.gather is not None or tensor.constant is not None:
        return
    shapes = [tuple(source.shape(p.tensor)) for p in tensor.pieces]
    got = sum(piece_values(s, p) for s, p in zip(shapes, tensor.pieces, strict=True))
    overrun = any(
        p.rows is not None and p.rows[1] * (s[-1] if len(s) > 1 else 1) > math.prod(s)
        for s, p in zip(shapes, tensor.pieces, strict=True)
    )
    if got == tensor.elements and not overrun:
        return
    read = sorted({_describe(source, p) for p in tensor.pieces})
    shown = ",".join(read[:2]) + (f" and {len(read) - 2} more" if len(read) > 2 else "")
    raise SourceError(
        f"{source.id}:{shown} cannot hold {tensor.name} {list(tensor.shape)}"
        f" ({got} values for {tensor.elements}); config.json does not describe these weights"
    )
