"""A MoE block whose routed experts are split between device memory and host memory.

    top, weights = block.route(x)                      the architecture's own routing
    out = block(x) + Σ_{pairs on the host} weight · expert(x)

``block(x)`` is the model's own MoE block with the host's experts left out (``None``, as
under expert parallelism), so the resident experts and the shared experts run exactly as
they do without offload; the host adds the pairs of the experts it holds, each weighted with
the routing weight the block's router gave it over the full top-k (never renormalised over a
subset, and with any scaling the router applies, such as GLM5Next's
``routed_scaling_factor``). Routing is one function per architecture, the block's ``route``,
which the block's own call routes with too: the two parts choose alike (bit-identically on
the CPU backend, where the same float32 products are computed twice; the router is a small
product beside the experts').

A block the split can take (``SparseMoe`` of Qwen3.5 and Qwen4Exp, ``GroupedMoe`` of
GLM5Next) offers:

* ``route(x) -> (top [N, k], weights [N, k])``;
* ``experts``: its routed experts, None where not held; assignable;
* ``hits``: None, or a device array [E] its call adds each routed pair to; assignable;
* ``expert(prefix, weights)``: a routed expert from prepared weights (``prefix`` + gate, up,
  down), as the block holds it;
* ``gated(gate_x, up_x)``: a routed expert's product of its gate and up rows, which joins
  them wherever its pairs are computed: ``moe.reference.expert`` on any backend's weights
  (the host's float32 ones, a streamed window's on the device), or between a
  ``host_products`` kernel's products (``host_experts``).

The split prepares its resident experts itself, one expert a ``backend.prepare`` call
(``prepare_experts``): on the CUDA backend each is then its own row window of the stored
banks, so every device expert has the same layout (which the CUDA expert table needs) and
one can leave the device alone. An expert that leaves (a placement sends it back to host
memory, a streamed window ends) is handed to the backend's ``release`` where it has one
(``release_weights``: the CUDA backend forgets its windows, so their memory goes with the
weights; the CPU backend holds no cache and has none).

On a backend with host nodes (``host_nodes``, ``host_node``: CUDA with
``NINFER_CUDA_HOST_NODES=1``), a call whose host pairs the host computes
queues them as one step of the device's stream: the rows and the routing copied to the host,
the host's pairs computed when the stream reaches them, the sum copied back, with no
synchronisation, so a decode step through split blocks is still captured as a CUDA graph (the
host's share a node of it). That holds for every call while the block's host experts all have
the host's kernel and no call of few rows streams (``node_ready``); the offload runs decode
steps eagerly where a block is not. A placement that changes the device's experts tells the
backend (``forget_graphs``): captured steps read the old experts' tables, and are captured
again.

Where the stream maps (``--expert-stream-decode mapped`` on a backend with
``prepare_mapped``), the host computes nothing: each host expert is prepared as the device
reads it in place from pinned host memory, and a call of few rows runs ``in_place``, a copy
of the block holding every expert (the resident ones and those), so it is the block's own
call, captured as without a budget; a prefill chunk still streams. Such a block holds no
``HostExpert`` (``host_experts`` is empty; ``on_host`` says which experts are in host
memory).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from ..backends import Weight, decode_eagerly
from ..backends.base import to_numpy
from .counters import ExpertCounters
from .host_experts import HostCompute, HostExpert

if TYPE_CHECKING:
    from .stream_window import ExpertStream

Array = Any

log = logging.getLogger("ninfer.expert_offload")

#: why a backend capturing decode steps as CUDA graphs runs them eagerly with offload on
HOST_ROUTING = "expert offload reads each MoE block's routing on the host every step"


@runtime_checkable
class SplittableMoe(Protocol):
    """What ``SplitMoe`` reads of a model's MoE block (see the module docstring)."""

    backend: Any
    experts: Sequence[Any]
    hits: Any  # None, or a device array [E] the block's call adds its routed pairs to

    def route(self, x: Array) -> tuple[Array, Array]: ...

    def expert(self, prefix: str, weights: Mapping[str, Weight]) -> Any: ...

    def gated(self, gate: Array, up: Array) -> Array: ...

    def __call__(self, x: Array) -> Array: ...


def expert_prefix(layer: int, expert: int) -> str:
    return f"text/layers/{layer}/moe/experts/{expert}/"


def expert_names(layer: int, expert: int) -> list[str]:
    return [expert_prefix(layer, expert) + w for w in ("gate", "up", "down")]


def prepare_experts(
    backend: Any, artifact: Any, layer: int, experts: Sequence[int], *, streamed: bool = False
) -> dict[int, dict[str, Weight]]:
    """``layer``'s routed ``experts`` prepared on ``backend``, each in a call of its own (one
    call for several would make one CUDA window of the rows from the first to the last,
    the experts between them included): expert -> its gate, up and down by name.
    ``streamed``: for the prefill window, all in one ``prepare_streamed`` call (each expert
    still a group of its own) where the backend has one (the CUDA backend keeps streamed
    experts in pinned host memory and uploads a window's together)."""
    groups = [expert_names(layer, e) for e in experts]
    if streamed and hasattr(backend, "prepare_streamed"):
        return dict(zip(experts, backend.prepare_streamed(artifact, groups), strict=True))
    return {e: backend.prepare(artifact, names) for e, names in zip(experts, groups, strict=True)}


def release_weights(backend: Any, weights: Iterable[Weight]) -> None:
    """Hand prepared weights that are done with to the backend's ``release`` (the CUDA
    backend's residency otherwise keeps their windows for good); a backend without a
    weight cache (the CPU's) has none, and the weights go when they are dropped."""
    release = getattr(backend, "release", None)
    if release is not None:
        release(list(weights))


class SplitMoe:
    """Wraps a layer's MoE block (holding the resident experts, the others ``None``) and
    computes the others' pairs on the host, or, for a call of many token rows or one whose
    host experts the host has no kernel for, streams them through the device (``stream``,
    ``stream_window``)."""

    def __init__(
        self,
        layer: int,
        inner: SplittableMoe,
        artifact: Any,
        host: HostCompute,
        counters: ExpertCounters,
        stream: ExpertStream | None = None,
        resident: Sequence[int] = (),
    ):
        """``resident``: the experts to prepare on the device (``prepare_experts``) beside
        any ``inner`` holds already; the others are held in host memory."""
        self.layer, self.inner, self.host, self.counters = layer, inner, host, counters
        self.backend = inner.backend
        self.artifact, self.stream = artifact, stream
        held = list(inner.experts)
        #: the prepared weights of the device experts this split prepared, for ``release``
        self.device = prepare_experts(
            self.backend, artifact, layer, [e for e in resident if held[e] is None]
        )
        for e, weights in self.device.items():
            held[e] = inner.expert(expert_prefix(layer, e), weights)
        inner.experts = held
        self.resident = np.array([w is not None for w in held], dtype=bool)
        #: the host experts' weights as the device reads them in place (``mapped`` decode)
        self.mapped: dict[int, dict[str, Weight]] = {}
        #: whether this block's host experts are read in place (none are then held for the
        #: host's own products: ``host_experts`` stays empty)
        self.maps = stream is not None and stream.maps_on(self.backend)
        #: the block with every expert, the host's read in place (None: calls of few rows
        #: compute the host's pairs on the host, or stream them)
        self.in_place = self._read_in_place()
        self.host_experts: dict[int, HostExpert] = {}
        self._hold_on_host()
        #: the host's share as a step of the device's stream (None: the backend offers none)
        self.node = (
            self.backend.host_node(self._host_part, _rows_shape)
            if getattr(self.backend, "host_nodes", False)
            else None
        )
        self.node_ready = self._node_ready()

    @property
    def experts(self) -> int:
        return len(self.resident)

    def _host_expert(self, e: int) -> HostExpert:
        return HostExpert.load(self.artifact, expert_prefix(self.layer, e), self.inner.gated)

    def place(self, resident: Sequence[int]) -> None:
        """Make exactly ``resident`` the device's experts: the others back to host memory
        first (their device memory released before the newcomers'), then the newcomers
        prepared on the backend."""
        keep = set(resident)
        experts = list(self.inner.experts)
        self.in_place = None  # (it holds the leaving experts' weights: remade below)
        for e in range(self.experts):
            if e not in keep and experts[e] is not None:
                experts[e] = None
                release_weights(self.backend, self.device.pop(e, {}).values())
        self.inner.experts = list(experts)
        fresh = [e for e in sorted(keep) if experts[e] is None]
        for e, weights in prepare_experts(self.backend, self.artifact, self.layer, fresh).items():
            experts[e] = self.inner.expert(expert_prefix(self.layer, e), weights)
            self.device[e] = weights
            self.host_experts.pop(e, None)
            self.mapped.pop(e, None)
        self.resident[:] = False
        self.resident[list(keep)] = True
        self.inner.experts = experts
        self.in_place = self._read_in_place()
        self._hold_on_host()
        self.node_ready = self._node_ready()
        if not self.captures:
            decode_eagerly(self.backend, HOST_ROUTING)
        forget = getattr(self.backend, "forget_graphs", None)
        if forget is not None:
            forget()

    @property
    def on_host(self) -> set[int]:
        """The experts held in host memory (not resident on the device)."""
        return {int(e) for e in np.flatnonzero(~self.resident)}

    def _hold_on_host(self) -> None:
        """Where the host computes this block's host pairs (it reads none in place), hold
        each host expert not held yet for it, packed for its kernel."""
        if self.maps:
            return
        fresh = [e for e in sorted(self.on_host) if e not in self.host_experts]
        for e in fresh:
            self.host_experts[e] = self._host_expert(e)
        self.host.pack([self.host_experts[e] for e in fresh])

    def _read_in_place(self) -> SplittableMoe | None:
        """A copy of the block holding every expert, the host's as the device reads them in
        place from pinned host memory (``prepare_mapped``), where the stream maps on this
        backend (``maps``), counting its pairs on the device (``ExpertCounters.on_device``:
        its routing never leaves it); None where it does not. A block whose host experts
        cannot be read so says so in the log and computes them on the host from then on."""
        if not self.maps:
            return None
        try:
            for e in sorted(self.on_host - set(self.mapped)):
                names = expert_names(self.layer, e)
                self.mapped[e] = self.backend.prepare_mapped(self.artifact, names)
        except ValueError as err:  # (the backend's MappingError)
            log.warning("layer %d: host experts computed on the host: %s", self.layer, err)
            self.mapped.clear()
            self.maps = False
            return None
        experts = list(self.inner.experts)
        for e, weights in self.mapped.items():
            experts[e] = self.inner.expert(expert_prefix(self.layer, e), weights)
        block = copy.copy(self.inner)
        block.experts = experts
        assert self.stream is not None  # (``maps``)
        link = [
            self.stream.expert_bytes(self, e) if e in self.mapped else 0
            for e in range(self.experts)
        ]
        block.hits = self.counters.on_device(self.layer, self.backend.xp, np.array(link))
        return block

    @property
    def captures(self) -> bool:
        """Whether a decode step through this block can be captured as a CUDA graph: it
        reads the host's experts in place, or computes them on a host node."""
        return self.in_place is not None or self.node_ready

    def _node_ready(self) -> bool:
        """Whether every call of few rows computes its host pairs on a host node: the backend
        has them, and no such call streams (``ExpertStream.streams_none``)."""
        return self.node is not None and (self.stream is None or self.stream.streams_none(self))

    def __call__(self, x: Array) -> Array:
        few = self.stream is None or not self.stream.takes(x.shape[0])  # not a prefill chunk
        if few and self.in_place is not None:
            return self.in_place(x)
        top, weights = self.inner.route(x)
        if few and self.node_ready:
            xp = self.backend.xp
            assert self.node is not None
            part = self.node(x.astype(xp.float32), top, weights.astype(xp.float32))
            return self.inner(x) + part
        top, weights = to_numpy(top), np.asarray(to_numpy(weights), dtype=np.float32)
        if self.stream is not None and self.stream.takes(len(top)):
            return self.stream(self, x, top, weights)
        if self.stream is not None and self.stream.spares_host(self, top):
            return self.stream(self, x, top, weights, prefetch=False)
        # the rows come to the host before the device's share is issued, so the device
        # computes its experts while the host computes its own
        xh = np.ascontiguousarray(to_numpy(x), dtype=np.float32)
        out = self.inner(x)
        part = self._host_part(xh, top, weights)
        return out if part is None else out + self.backend.xp.asarray(part)

    def _host_part(self, x: np.ndarray, top: np.ndarray, weights: np.ndarray) -> np.ndarray | None:
        """The host's pairs of rows ``x`` routed to ``top`` with ``weights`` (None: it holds
        none of the chosen experts), counted."""
        start = time.perf_counter()
        part = self.host(x, top, weights, self.host_experts)
        waited = time.perf_counter() - start
        held = self.host_experts
        read = sum(held[e].nbytes for e in set(top.ravel().tolist()) if e in held)
        self.counters.record(self.layer, top, self.resident, waited, read)
        return part


def _rows_shape(x: tuple[int, ...], top: tuple[int, ...], weights: tuple[int, ...]) -> tuple:
    """A host node's output: the shape of its rows ``x``."""
    return x
