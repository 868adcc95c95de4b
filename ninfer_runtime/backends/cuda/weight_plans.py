"""Which stored rows make up a parameter: its plan (``plan_segments``: whole rows of packed
objects, or None where it must be decoded), the runs of a plan some of its rows take
(``rows_of_plan``), and a tensor-parallel rank's share of a parameter as cuts of the stored
objects (``rank_share``). Bookkeeping on the artifact's metadata only: ``weights.Residency``
uploads what these name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer_format.codecs.gguf_blocks import LAYOUT as GGUF_LAYOUT
from ninfer_format.schema import Tensor, WholeBinding

from .formats import PACKED


def keeps_layout(name: str) -> bool:
    """Whether parameter ``name`` must stay in its stored layout: the MoE blocks' weights,
    which the expert kernels read as stored (everything else is read by ``linear``)."""
    return "/moe/" in name


def matrix_shape(obj: Tensor) -> tuple[int, int] | None:
    """The ``[rows, columns]`` matrix a kernel reads an object as: rank 2, or any rank for
    ``gguf_*`` blocks (rows are stored in order, so an expert bank ``[E, N, K]`` is
    ``[E·N, K]``); None otherwise."""
    shape = [int(d) for d in obj.shape]
    if len(shape) == 2 or (len(shape) > 2 and obj.layout == GGUF_LAYOUT):
        return math.prod(shape[:-1]), shape[-1]
    return None


def plan_segments(artifact: Any, name: str) -> list[tuple[str, int, int]] | None:
    """``[(object_id, row0, rows)]`` when the parameter is whole rows of packed objects with
    its own column count; None when it must be decoded instead."""
    shape = artifact.binder_report.parameters.get(name)
    binding = artifact.bindings[name]
    if shape is None or len(shape) != 2:
        return None
    rows, columns = (int(d) for d in shape)
    if isinstance(binding, WholeBinding):
        pieces = [(binding.object, 0, None)]
    else:
        pieces = [(p.object, p.range[0], p.range[1]) for p in binding.parts]
    out: list[tuple[str, int, int]] = []
    for oid, begin, end in pieces:
        obj = artifact.objects.get(oid)
        if not isinstance(obj, Tensor) or (obj.format, obj.layout) not in PACKED:
            return None
        matrix = matrix_shape(obj)
        if matrix is None or matrix[1] != columns:
            return None
        if end is None:
            begin, end = 0, matrix[0] * columns
        if begin % columns or end % columns:
            return None  # an element range that cuts a row
        row0, count = begin // columns, (end - begin) // columns
        if out and out[-1][0] == oid and out[-1][1] + out[-1][2] == row0:
            out[-1] = (oid, out[-1][1], out[-1][2] + count)  # adjacent ranges: one segment
        else:
            out.append((oid, row0, count))
    if sum(count for _, _, count in out) != rows:
        return None
    return out


def rows_of_plan(plan: list[tuple[str, int, int]], rows: Any) -> list[tuple[str, int, int]]:
    """The segments of ``plan`` (a parameter's rows in order, as ``plan_segments`` gives them)
    holding the parameter rows ``rows`` (sorted, distinct), in order, adjacent ones merged."""
    rows = np.asarray(rows, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    runs = [(int(r[0]), int(r[-1]) + 1) for r in np.split(rows, breaks) if r.size]
    out: list[tuple[str, int, int]] = []
    for a, b in runs:
        start = 0  # the parameter row each segment of the plan starts at
        for oid, row0, count in plan:
            lo, hi = max(a, start), min(b, start + count)
            if lo < hi:
                first = row0 + lo - start
                if out and out[-1][0] == oid and out[-1][1] + out[-1][2] == first:
                    out[-1] = (oid, out[-1][1], out[-1][2] + hi - lo)
                else:
                    out.append((oid, first, hi - lo))
            start += count
    return out


@dataclass(frozen=True)
class Cut:
    """Rows ``row0 .. row0 + rows - 1`` and columns ``columns`` of a stored object: one
    piece of a tensor-parallel rank's share of a parameter, held as an object of its own."""

    object_id: str
    row0: int
    rows: int
    columns: tuple[int, int]

    @property
    def key(self) -> str:
        (c0, c1), end = self.columns, self.row0 + self.rows
        return f"{self.object_id}[{self.row0}:{end}, {c0}:{c1}]"


@dataclass(frozen=True)
class Share:
    """A rank's share of a parameter, of ``shape``: ``cuts`` of the stored objects in the
    parameter's row order, or None where the share must be decoded (``artifact.parameter``);
    ``by_rows``: split by rows, so the stored column order holds."""

    cuts: list[Cut] | None
    shape: tuple[int, ...]
    by_rows: bool


def rank_share(artifact: Any, name: str, plan: list[tuple[str, int, int]] | None) -> Share | None:
    """What a tensor-parallel rank holds of parameter ``name`` (``plan``: its whole plan) on
    an artifact with ``share`` (``models.qwen3_5.shard.ShardedArtifact``): its rows of a split
    by rows, or its one run of columns of a split by columns, as cuts; None where it holds the
    parameter whole (or the artifact is not split)."""
    share = getattr(artifact, "share", None)
    taken = share(name) if share is not None else None
    if taken is None:
        return None
    axis, index = taken
    full = tuple(int(d) for d in artifact.binder_report.parameters[name])
    shape = (*full[:axis], len(index), *full[axis + 1 :])
    if plan is None or len(full) != 2:
        return Share(None, shape, axis == 0)
    if axis == 0:
        pieces = rows_of_plan(plan, index)
        return Share([Cut(o, r0, rows, (0, full[1])) for o, r0, rows in pieces], shape, True)
    c0, c1 = int(index[0]), int(index[-1]) + 1
    if c1 - c0 != len(index) or artifact.input_columns(name) is not None:
        return Share(None, shape, False)  # (stored columns in another order)
    return Share([Cut(o, r0, rows, (c0, c1)) for o, r0, rows in plan], shape, False)
