"""Routed experts in host memory, computed on the CPU.

Two ways, as the moe family's ``host_products`` resolves for the engine's device:

* a kernel (beside a GPU, ``torch_int4``): the expert's stored codes are repacked once, at
  load, into the kernel's layout (``HostExpert.pack``: gate and up as one weight, so a use is
  two products, the block's ``gated`` between them), and the products read the codes inside
  the product;
* the reference (beside the CPU backend, and for weights a kernel cannot read): the expert
  holds its weights as stored (``stored_weights``); a use decodes one intermediate block at a
  time with the format's own codec to float32 and adds the block's share of the MoE block's
  expert math, never materialising a whole decoded matrix; the hottest host experts
  (``host_cache``, by the same routing counts that rank residency) keep a decoded float32
  copy within ``[engine] host_expert_cache`` and skip decoding.

The chosen experts are computed in groups side by side, the calling thread taking the first
and a thread pool sized to the cores the others (numpy's decode and products and torch's
kernels release the GIL); a kernel's experts by default take every core one after another,
on the calling thread alone. The partial sums are added in expert order, so the result does
not depend on which thread finished first. ``HostExpert.decoded`` names the experts whose
layout could not be cut (held as float32), and the load log says so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..backends.cpu import CpuBackend
from ..functional import silu_mul
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
    "host_threads",
    "load_host_weight",
]

log = logging.getLogger("ninfer.expert_offload")

#: the reference math the CPU backend computes experts with: the host computes the same
#: products in the same order, so a host expert's rows equal a resident one's on the CPU
HOST_MATH = CpuBackend()


#: the MoE block's ``gated(gate_x, up_x)``: the product joining an expert's gate and up rows
Gated = Callable[[np.ndarray, np.ndarray], np.ndarray]


class HostExpert:
    """A routed expert held in host memory: its weights repacked for a kernel (``pack``), or
    as stored (cut into intermediate blocks at its first use, where the layout allows: about
    10 ms a 2048 x 768 q4 expert, paid once, not at load), the block's ``gated`` product,
    and, for the hottest reference experts within ``[engine] host_expert_cache``, a decoded
    float32 copy."""

    def __init__(
        self,
        gate: HostWeight,
        up: HostWeight,
        down: HostWeight,
        gated: Gated = silu_mul,
        *,
        by_blocks: bool = True,
    ):
        """``gated``: the block's product of gate and up rows; ``by_blocks`` False: always
        decode whole matrices (the benchmark's baseline)."""
        self.gated = gated
        #: gate and up joined, and down, in a kernel's layout, and that kernel (``pack``)
        self.packed: tuple[Any, Any] | None = None
        self.kernel: Any = None
        #: the whole weights, until (and unless) they are cut into blocks or packed
        self.whole: tuple[HostWeight, HostWeight, HostWeight] | None = (gate, up, down)
        self._blocks: tuple | None = None
        self._cut = not by_blocks  # whether cutting was tried (or is not wanted)
        self.inner, self.hidden = gate.rows, down.rows
        #: decoded float32 gate, up, down while this expert is among the hottest
        self.held: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @classmethod
    def load(cls, artifact: Any, prefix: str, gated: Gated = silu_mul) -> HostExpert:
        """The expert whose weights are ``prefix`` + gate, up, down (a plain gated MLP
        unless ``gated`` says otherwise)."""
        names = ("gate", "up", "down")
        return cls(*(load_host_weight(artifact, prefix + w) for w in names), gated)

    def pack(self, kernel: Any) -> bool:
        """Repack the stored weights for ``kernel`` (a ``host_products`` kernel: ``pack``,
        ``linear``), gate and up as one weight (gate rows, then up rows: one product where
        there were two, which at a decode step's one row costs what one of them did),
        dropping the stored form; False, leaving the expert as it was, where the kernel
        cannot read them (or they are cut already)."""
        if self.packed is not None:
            return True
        if self.whole is None or any(w.values is not None for w in self.whole):
            return False
        gate, up, down = self.whole
        if gate.columns is not None or up.columns is not None:
            return False  # input columns stored in another order: no kernel reads them
        gate_up = kernel.pack([*gate.pieces, *up.pieces], None)
        down_packed = kernel.pack(down.pieces, down.columns)
        if gate_up is None or down_packed is None:
            return False
        self.packed = (gate_up, down_packed)
        self.kernel = kernel
        self.whole, self._cut, self.held = None, True, None
        return True

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
        """Host bytes of its stored (or packed) form (the decoded copy, if held, is
        ``held_bytes``)."""
        if self.packed is not None:
            return sum(w.nbytes for w in self.packed)
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
        """gate, up, down as float32 (the held copy, or decoded now; not for a packed
        expert, whose stored form is gone)."""
        if self.packed is not None:
            raise ValueError("a packed host expert keeps no stored weights to decode")
        if self.held is not None:
            return self.held
        if self.whole is not None:
            gate, up, down = self.whole
            return gate.decode(), up.decode(), down.decode()
        blocks = self._blocks or ()
        gate = np.concatenate([decode_stack(b[0]) for b in blocks])
        up = np.concatenate([decode_stack(b[1]) for b in blocks])
        return gate, up, np.concatenate([decode_stack(b[2]) for b in blocks], axis=1)

    @property
    def holds_copies(self) -> bool:
        """Whether a decoded copy would speed it up (a packed expert's kernel reads its
        codes faster than float32 values)."""
        return self.packed is None

    def hold(self, keep: bool) -> None:
        """Keep (or drop) a decoded float32 copy of the weights (never for a packed one)."""
        self.held = (self.held or self.weights()) if keep and self.holds_copies else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The expert on rows x [n, H], float32: on the kernel's products when packed, on
        the held copy, else block by block from the stored codes
        (``benchmarks/expert_offload_host_bench.py`` measures each way)."""
        if self.packed is not None:
            gate_up, down = self.packed
            rows = self.kernel.linear(x, gate_up)
            both = self.gated(rows[:, : self.inner], rows[:, self.inner :])
            return self.kernel.linear(both, down)
        blocks = None if self.held is not None else self.blocks
        if blocks is None:
            return self.math(x, *self.weights())
        out = None
        for gate, up, down in blocks:
            part = self.math(x, decode_stack(gate), decode_stack(up), decode_stack(down))
            out = part if out is None else out + part
        return out  # type: ignore[return-value]

    def math(self, x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
        """The expert's math on float32 weights and the host's float32 products (the
        reference way: a resident expert's on the CPU backend)."""
        return expert(HOST_MATH, x, gate, up, down, self.gated)


def host_threads() -> int:
    """The cores this process may run on."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class HostCompute:
    """The host's share of MoE blocks: the chosen experts it holds, on a thread pool."""

    def __init__(
        self, threads: int | None = None, kernel: Any = None, kernel_threads: int | None = None
    ):
        """``kernel``: the ``host_products`` kernel host experts are packed for (None: the
        reference's decoding); ``kernel_threads``: the cores one expert's kernel products
        take, the pool running ``threads // kernel_threads`` experts side by side (None:
        every core on one expert after another, which the engine's steps measured fastest at
        one lane and at eight: docs/performance.md)."""
        self.threads = threads or host_threads()
        self.kernel = kernel
        self.kernel_threads = kernel_threads
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ninfer-experts")

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def log_forms(self, blocks: Iterable[Any]) -> None:
        """Say how many of the split ``blocks``' host experts the kernel packed, and how many
        are held decoded (their layout could not be cut)."""
        experts = [e for b in blocks for e in b.host_experts.values()]
        if self.kernel is not None and experts:
            packed = sum(e.packed is not None for e in experts)
            log.info("%d host experts packed for %s", packed, self.kernel.name)
        decoded = sum(e.decoded for e in experts)
        if decoded:
            log.info("%d host experts are held decoded: their layout cannot be cut", decoded)

    def pack(self, experts: Iterable[HostExpert]) -> int:
        """Repack ``experts`` for the kernel, one expert a task on the pool (each task on
        one core); returns how many the kernel took (the others stay with the reference)."""
        kernel = self.kernel
        if kernel is None:
            return 0

        def one(e: HostExpert) -> bool:
            kernel.use_threads(1)
            return e.pack(kernel)

        return sum(self._pool.map(one, list(experts)))

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
        chosen = sorted(e for e in set(top.ravel().tolist()) if e in experts)
        if not chosen:
            return None
        # experts side by side: a kernel's take ``cores`` each, the reference's one a thread
        cores = min(self.kernel_threads or self.threads, self.threads)
        side = min(self.threads // cores if self.kernel is not None else self.threads, len(chosen))

        def some(group: Sequence[int]) -> list[tuple[int, np.ndarray, np.ndarray]]:
            if self.kernel is not None:
                self.kernel.use_threads(cores)
            parts = []
            for e in group:
                rows, slot = np.nonzero(top == e)
                parts.append((e, rows, share[rows, slot, None] * experts[e](x[rows])))
            return parts

        groups = [chosen[i::side] for i in range(side)]
        # the calling thread takes the first group itself rather than wait for the pool
        others = [self._pool.submit(some, g) for g in groups[1:]]
        parts = some(groups[0])
        for done in others:
            parts += done.result()
        out = np.zeros(x.shape, dtype=np.float32)
        # in expert order: the same sum whichever thread ran first
        for _, rows, part in sorted(parts, key=lambda p: p[0]):
            out[rows] += part
        return out
