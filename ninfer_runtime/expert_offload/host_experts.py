"""Routed experts in host memory, in their stored format, computed on the CPU.

An expert's gate, up and down weights are cut out of the artifact's packed expert banks as
stored bytes (``ninfer_format.codecs.slicing``: the same codes and scales, only its rows),
so host memory holds them at their stored size; each use decodes them with the format's own
codec to float32 and runs the gated MLP in float32, one expert a task on a thread pool sized
to the cores (numpy's decode and products release the GIL). The partial sums are added in
expert order, so the result does not depend on which thread finished first.

A weight whose layout cannot be cut by rows here (NVFP4's swizzled scale blocks, FP8's row
scales, element ranges that cut a row) is kept decoded, as float32; ``HostExpert.decoded``
names those, and the load log says so.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer_format.codecs.gguf_blocks import LAYOUT as GGUF_LAYOUT
from ninfer_format.codecs.registry import codec_for
from ninfer_format.codecs.slicing import slice_object
from ninfer_format.schema import Tensor, WholeBinding

from ..backends.cpu import CpuBackend

#: the reference math the CPU backend computes experts with: the host computes the same
#: products in the same order, so a host expert's rows equal a resident one's on the CPU
HOST_MATH = CpuBackend()


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
        return codec.decode(self.data, self.shape).reshape(self.shape).astype(np.float32)


@dataclass(frozen=True)
class HostWeight:
    """One weight of a host expert: its stored pieces (rows in order), or, where they could
    not be cut, its decoded values; ``columns`` puts stored input columns in place."""

    pieces: tuple[StoredRows, ...]
    values: np.ndarray | None  # float32, only where the pieces could not be cut
    columns: np.ndarray | None

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
        if (obj.divisors or 1) != 1:
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


@dataclass(frozen=True)
class HostExpert:
    """A routed expert held in host memory."""

    gate: HostWeight
    up: HostWeight
    down: HostWeight

    @classmethod
    def load(cls, artifact: Any, prefix: str) -> HostExpert:
        """The expert whose weights are ``prefix`` + gate, up, down."""
        return cls(*(load_host_weight(artifact, prefix + w) for w in ("gate", "up", "down")))

    @property
    def nbytes(self) -> int:
        return self.gate.nbytes + self.up.nbytes + self.down.nbytes

    @property
    def decoded(self) -> bool:
        """Whether any of its weights is held decoded (its layout could not be cut)."""
        return any(w.values is not None for w in (self.gate, self.up, self.down))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``down(silu(gate x) * up x)`` on rows x [n, H], float32, the stored codes decoded
        for this call only."""
        return HOST_MATH._mlp(x, self.gate.decode(), self.up.decode(), self.down.decode())


def host_threads() -> int:
    """The cores this process may run on."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class HostCompute:
    """The host's share of MoE blocks: the chosen experts it holds, on a thread pool."""

    def __init__(self, threads: int | None = None):
        self.threads = threads or host_threads()
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ninfer-experts")

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def __call__(
        self,
        x: np.ndarray,
        top: np.ndarray,
        share: np.ndarray,
        experts: Mapping[int, Callable[[np.ndarray], np.ndarray]],
    ) -> np.ndarray | None:
        """``Σ share · expert(x)`` over the (row, slot) pairs of ``top`` [N, k] whose expert
        is in ``experts`` (``HostExpert``s), each weighted with its routing weight ``share``
        [N, k] as the router gave it (never renormalised over the host's pairs); float32
        [N, H], or None when the host holds none of the chosen experts."""
        chosen = [int(e) for e in np.unique(top) if int(e) in experts]
        if not chosen:
            return None

        def one(e: int) -> tuple[np.ndarray, np.ndarray]:
            rows, slot = np.nonzero(top == e)
            return rows, share[rows, slot, None] * experts[e](x[rows])

        out = np.zeros(x.shape, dtype=np.float32)
        parts: Sequence[tuple[np.ndarray, np.ndarray]]
        if self.threads == 1 or len(chosen) == 1:
            parts = [one(e) for e in chosen]
        else:
            parts = list(self._pool.map(one, chosen))
        for rows, part in parts:  # in expert order: the same sum whichever thread ran first
            out[rows] += part
        return out
