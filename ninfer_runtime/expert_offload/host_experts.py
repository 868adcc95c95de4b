"""Routed experts in host memory, computed on the CPU.

A host expert holds its weights as stored (``stored_weights``); a use decodes one
intermediate block at a time with the format's own codec to float32 and adds the block's
share of the MoE block's expert math, never materialising a whole decoded matrix; the
hottest host experts (``hold_hottest``, by the same routing counts that rank residency) keep
a decoded float32 copy within ``[engine] host_expert_cache`` and skip decoding. One expert
is a task on a thread pool sized to the cores (numpy's decode and products release the
GIL); the partial sums are added in expert order, so the result does not depend on which
thread finished first. ``HostExpert.decoded`` names the experts whose layout could not be
cut (held as float32), and the load log says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..backends.cpu import CpuBackend
from ..ops.moe.reference import expert
from .stored_weights import (
    HostWeight,
    StoredRows,
    decode_stack,
    intermediate_blocks,
    load_host_weight,
)

__all__ = [
    "HOST_MATH",
    "HostCompute",
    "HostExpert",
    "HostWeight",
    "StoredRows",
    "hold_hottest",
    "host_threads",
    "load_host_weight",
]

#: the reference math the CPU backend computes experts with: the host computes the same
#: products in the same order, so a host expert's rows equal a resident one's on the CPU
HOST_MATH = CpuBackend()


#: the math of one routed expert on float32 weights: ``math(x, gate, up, down)`` (the MoE
#: block's ``expert_math`` on the host's backend)
ExpertMath = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]


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
        gate = np.concatenate([decode_stack(b[0]) for b in blocks])
        up = np.concatenate([decode_stack(b[1]) for b in blocks])
        return gate, up, np.concatenate([decode_stack(b[2]) for b in blocks], axis=1)

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
            part = self.math(x, decode_stack(gate), decode_stack(up), decode_stack(down))
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
