"""Routed experts' weights as host memory keeps them: their stored bytes, not decoded.

An expert's gate, up and down weights are cut out of the artifact's packed expert banks as
stored bytes (``ninfer_format.codecs.slicing``: the same codes and scales, only its rows),
so host memory holds them at their stored size. ``intermediate_blocks`` cuts an expert again
along its intermediate dimension, into blocks of 128 (or 256) rows of gate and up and the
same columns of down: the expert is the sum of its blocks' experts (the activation is
elementwise over that dimension), so a use can decode one block at a time.

A weight whose layout cannot be cut by rows there (an NVFP4 cut through a 128-row scale tile,
element ranges that cut a row, a layout ``slice_object`` does not cut) is kept decoded, as
float32. An NVFP4 piece carries the weight divisors of the stacked matrices its rows come from
(one per expert in an imported bank), so it decodes with the count its size gives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer_format.codecs.gguf_blocks import LAYOUT as GGUF_LAYOUT
from ninfer_format.codecs.registry import codec_for
from ninfer_format.codecs.slicing import slice_object, stored_divisors
from ninfer_format.schema import Tensor, WholeBinding


@dataclass(frozen=True)
class StoredRows:
    """Rows of a stored object cut out as an object of their own: ``data`` are its bytes in
    ``format``/``layout``, ``shape`` its ``[rows, columns]``."""

    format: str
    layout: str
    data: np.ndarray  # uint8, owned
    shape: tuple[int, int]

    def decode(self) -> np.ndarray:
        codec = codec_for(self.format, self.layout)
        divisors = stored_divisors(self.format, self.layout, self.shape, self.data.size)
        return codec.decode(self.data, self.shape, divisors).reshape(self.shape).astype(np.float32)


@dataclass(frozen=True)
class HostWeight:
    """One weight of a host expert: its stored pieces (rows in order), or, where they could
    not be cut, its decoded values; ``columns`` puts stored input columns in place."""

    pieces: tuple[StoredRows, ...]
    values: np.ndarray | None  # float32, only where the pieces could not be cut
    columns: np.ndarray | None

    @property
    def rows(self) -> int:
        if self.values is not None:
            return int(self.values.shape[0])
        return sum(p.shape[0] for p in self.pieces)

    @property
    def nbytes(self) -> int:
        if self.values is not None:
            return int(self.values.nbytes)
        return sum(int(p.data.nbytes) for p in self.pieces)

    def decode(self) -> np.ndarray:
        if self.values is not None:
            return self.values
        values = np.concatenate([p.decode() for p in self.pieces])
        if self.columns is not None:
            placed = np.empty_like(values)
            placed[:, self.columns] = values
            values = placed
        return values


def _matrix(obj: Tensor) -> tuple[int, int] | None:
    """The ``[rows, columns]`` an object's rows are stored as: rank 2, or a ``gguf_*`` bank
    of any rank (its rows stored in order)."""
    shape = [int(d) for d in obj.shape]
    if len(shape) == 2 or (len(shape) > 2 and obj.layout == GGUF_LAYOUT):
        return math.prod(shape[:-1]), shape[-1]
    return None


def _cut(artifact: Any, name: str, columns: int) -> tuple[StoredRows, ...] | None:
    """The parameter's rows as stored pieces, None where some part cannot be cut by rows."""
    binding = artifact.bindings[name]
    if isinstance(binding, WholeBinding):
        obj = artifact.objects[binding.object]
        parts = [(binding.object, 0, int(obj.elements))]
    else:
        parts = [(p.object, p.range[0], p.range[1]) for p in binding.parts]
    pieces = []
    for object_id, begin, end in parts:
        obj = artifact.objects[object_id]
        matrix = _matrix(obj) if isinstance(obj, Tensor) else None
        if matrix is None or matrix[1] != columns or begin % columns or end % columns:
            return None
        rows = (begin // columns, end // columns)
        data = slice_object(
            obj.format, obj.layout, artifact.raw(object_id), matrix, rows, (0, columns)
        )
        if data is None:
            return None
        shape = (rows[1] - rows[0], columns)
        pieces.append(StoredRows(obj.format, obj.layout, np.frombuffer(data, np.uint8), shape))
    return tuple(pieces)


def load_host_weight(artifact: Any, name: str) -> HostWeight:
    """Parameter ``name`` (a matrix) as host memory keeps it."""
    rows, columns = (int(d) for d in artifact.binder_report.parameters[name])
    pieces = _cut(artifact, name, columns)
    if pieces is None:
        values = np.asarray(artifact.parameter(name, in_order=True), dtype=np.float32)
        return HostWeight((), np.ascontiguousarray(values.reshape(rows, columns)), None)
    return HostWeight(pieces, None, artifact.input_columns(name))


#: the widths of the intermediate blocks tried, in order (a K-quant's column cuts need 256)
BLOCK_WIDTHS = (128, 256)

Stack = tuple[StoredRows, ...]  # pieces stacked by rows


def decode_stack(stack: Stack) -> np.ndarray:
    return stack[0].decode() if len(stack) == 1 else np.concatenate([p.decode() for p in stack])


def _cut_stored(piece: StoredRows, rows: tuple[int, int], columns: tuple[int, int]) -> StoredRows:
    data = slice_object(piece.format, piece.layout, piece.data, piece.shape, rows, columns)
    if data is None:
        raise ValueError("not cut")
    shape = (rows[1] - rows[0], columns[1] - columns[0])
    return StoredRows(piece.format, piece.layout, np.frombuffer(data, np.uint8), shape)


def intermediate_blocks(gate: HostWeight, up: HostWeight, down: HostWeight) -> tuple | None:
    """The expert cut along its intermediate dimension I into blocks ``(gate rows, up rows,
    down columns)`` of stored bits: the expert is the sum of its blocks' experts (the
    activation is elementwise over I), so a use decodes one block at a time, never a whole
    matrix. None where a weight is held decoded, has its input columns reordered, or its
    layout cannot be cut so."""
    weights = (gate, up, down)
    if any(w.values is not None or w.columns is not None for w in weights):
        return None
    inner = sum(p.shape[0] for p in gate.pieces)
    for width in BLOCK_WIDTHS:
        try:
            spans = [(c, min(c + width, inner)) for c in range(0, inner, width)]
            rows_of = [_row_blocks(w.pieces, spans) for w in (gate, up)]
            down_of = [
                tuple(_cut_stored(p, (0, p.shape[0]), span) for p in down.pieces) for span in spans
            ]
        except ValueError:
            continue
        return tuple(zip(rows_of[0], rows_of[1], down_of, strict=True))
    return None


def _row_blocks(pieces: Stack, spans: list[tuple[int, int]]) -> list[Stack]:
    """Rows ``spans`` of the pieces stacked by rows, each a stack of cut pieces."""
    out = []
    for begin, end in spans:
        stack, at = [], 0
        for p in pieces:
            lo, hi = max(begin, at), min(end, at + p.shape[0])
            if lo < hi:
                stack.append(_cut_stored(p, (lo - at, hi - at), (0, p.shape[1])))
            at += p.shape[0]
        out.append(tuple(stack))
    return out
