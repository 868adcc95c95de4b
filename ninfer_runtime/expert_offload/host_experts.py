"""Routed experts in host memory, in their stored format, computed on the CPU.

An expert's gate, up and down weights are cut out of the artifact's packed expert banks as
stored bytes (``ninfer_format.codecs.slicing``: the same codes and scales, only its rows),
so host memory holds them at their stored size, cut along the intermediate dimension into
blocks of 128 (or 256) rows of gate and up and columns of down. A use decodes one block at a
time with the format's own codec to float32 and adds the block's share of the block's expert
math (the activation is elementwise, so the blocks' sum is the expert), never materialising
a whole decoded matrix; the hottest host experts (``hold_hottest``, by the same routing
counts that rank residency) keep a decoded float32 copy within ``[engine]
host_expert_cache`` and skip decoding. One expert is a task on a thread pool sized to the
cores (numpy's decode and products release the GIL); the partial sums are added in expert
order, so the result does not depend on which thread finished first.

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
from ..ops.moe.reference import expert

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


#: the math of one routed expert on float32 weights: ``math(x, gate, up, down)`` (the MoE
#: block's ``expert_math`` on the host's backend)
ExpertMath = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
#: the widths of the intermediate blocks tried, in order (a K-quant's column cuts need 256)
BLOCK_WIDTHS = (128, 256)

Stack = tuple[StoredRows, ...]  # pieces stacked by rows


def _decode(stack: Stack) -> np.ndarray:
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


class HostExpert:
    """A routed expert held in host memory: its weights as stored (cut into intermediate
    blocks at its first use, where the layout allows: about 10 ms a 2048 x 768 q4 expert,
    paid once, not at load), the block's math for one expert, and, for the hottest host
    experts within ``[engine] host_expert_cache``, a decoded float32 copy."""

    def __init__(
        self,
        gate: HostWeight,
        up: HostWeight,
        down: HostWeight,
        math: ExpertMath | None = None,
        *,
        by_blocks: bool = True,
    ):
        """``by_blocks`` False: always decode whole matrices (the benchmark's baseline)."""
        self.math: ExpertMath = math or (lambda x, g, u, d: expert(HOST_MATH, x, g, u, d))
        #: the whole weights, until (and unless) they are cut into blocks
        self.whole: tuple[HostWeight, HostWeight, HostWeight] | None = (gate, up, down)
        self._blocks: tuple | None = None
        self._cut = not by_blocks  # whether cutting was tried (or is not wanted)
        self.inner, self.hidden = gate.rows, down.rows
        #: decoded float32 gate, up, down while this expert is among the hottest
        self.held: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @classmethod
    def load(cls, artifact: Any, prefix: str, math: ExpertMath | None = None) -> HostExpert:
        """The expert whose weights are ``prefix`` + gate, up, down (a plain gated MLP
        unless ``math`` says otherwise)."""
        return cls(*(load_host_weight(artifact, prefix + w) for w in ("gate", "up", "down")), math)

    @property
    def blocks(self) -> tuple | None:
        """The intermediate blocks, cut at the first need (None: the layout cannot be cut);
        the whole pieces go once they are cut."""
        if not self._cut:
            self._cut = True
            assert self.whole is not None
            self._blocks = intermediate_blocks(*self.whole)
            if self._blocks is not None:
                self.whole = None
        return self._blocks

    @property
    def nbytes(self) -> int:
        """Host bytes of its stored form (the decoded copy, if held, is ``held_bytes``)."""
        if self.whole is not None:
            return sum(w.nbytes for w in self.whole)
        return sum(int(p.data.nbytes) for block in self._blocks or () for s in block for p in s)

    @property
    def decoded_bytes(self) -> int:
        """Bytes of a decoded float32 copy of its weights."""
        return 4 * 3 * self.inner * self.hidden

    @property
    def held_bytes(self) -> int:
        return self.decoded_bytes if self.held is not None else 0

    @property
    def decoded(self) -> bool:
        """Whether any of its weights is held decoded (its layout could not be cut)."""
        return self.whole is not None and any(w.values is not None for w in self.whole)

    def weights(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """gate, up, down as float32 (the held copy, or decoded now)."""
        if self.held is not None:
            return self.held
        if self.whole is not None:
            gate, up, down = self.whole
            return gate.decode(), up.decode(), down.decode()
        blocks = self._blocks or ()
        gate = np.concatenate([_decode(b[0]) for b in blocks])
        up = np.concatenate([_decode(b[1]) for b in blocks])
        return gate, up, np.concatenate([_decode(b[2]) for b in blocks], axis=1)

    def hold(self, keep: bool) -> None:
        """Keep (or drop) a decoded float32 copy of the weights."""
        self.held = (self.held or self.weights()) if keep else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The expert on rows x [n, H], float32: on the held copy, else block by block from
        the stored codes (``benchmarks/expert_offload_host_bench.py`` measured both against
        decoding whole matrices)."""
        blocks = None if self.held is not None else self.blocks
        if blocks is None:
            return self.math(x, *self.weights())
        out = None
        for gate, up, down in blocks:
            part = self.math(x, _decode(gate), _decode(up), _decode(down))
            out = part if out is None else out + part
        return out  # type: ignore[return-value]


def hold_hottest(experts: Sequence[tuple[float, HostExpert]], allowance: int) -> int:
    """Keep decoded copies of the experts most chosen first (``(priority, expert)``; among
    equals, in the order given) while their bytes fit ``allowance``; drop the others'.
    Returns the bytes held."""
    used = 0
    order = sorted(range(len(experts)), key=lambda i: -experts[i][0])
    keep = set()
    for i in order:
        size = experts[i][1].decoded_bytes
        if used + size <= allowance:
            keep.add(i)
            used += size
    for i, (_, host_expert) in enumerate(experts):
        host_expert.hold(i in keep)
    return used


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
