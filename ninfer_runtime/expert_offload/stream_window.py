"""The prefill window: for large token counts, the host experts a chunk routes to are
streamed to the device and computed there instead of on the host.

A decode step gives each chosen expert a row or a few: the host computes those pairs where
the expert already lives, reading its weights once. A prefill chunk gives each expert many
rows, so moving its stored bytes to the device once and computing all its pairs with the
device's products costs less than the host's products (on a GPU the break-even is a few rows
an expert). A block call of more than ``stream_rows`` token rows (``STREAM_ROWS`` unless the
offload is given another) therefore takes this path, for each MoE layer in turn:

1. the window: the layer's host experts the chunk routes to, in expert order, cut into
   parts whose stored bytes fit ``window_bytes`` (None: one part; a part holds at least one
   expert);
2. each part is prepared on the backend, each expert a window of its own
   (``prepare_experts``, as a placement prepares a newly resident expert; a backend with
   ``prepare_streamed`` takes the part in one call), its pairs computed on the device, and its
   weights released (``release_weights``: the CUDA backend's residency forgets their
   windows, so their device memory goes once the part is done);
3. the first part runs inside the block's own call, put in place for that call, so the
   resident experts, the shared experts and the part's pairs are computed exactly as with
   all experts resident (bit for bit on the CPU when the window is one part); each further
   part's pairs are computed with the block's ``gated`` product on its prepared weights, each
   weighted as the router gave it, and added in expert order.

A call of few rows (a decode step) is computed on the host, or on a GPU as ``decode`` says
(``--expert-stream-decode``). ``mapped``: no call of few rows streams or computes on the
host; the device reads the host experts it routes to in place, their stored bytes kept in
pinned host memory (``maps_on``, ``SplitMoe.in_place``, the CUDA backend's
``prepare_mapped``): every pair reads its expert over the link, with no copy, no host work
and nothing read back, so decode steps are captured as without a budget. ``auto`` (the
default) is ``mapped`` on a GPU (by far the fastest there: docs/performance.md). Otherwise
the call streams (``spares_host``): with ``auto`` where the host has no kernel for a host
expert it routes to (such an expert is computed the reference way, its codes decoded at
every use, which takes the host far longer than the link takes to copy its stored bytes:
NVFP4, which ``host_products`` has no kernel for); with ``all`` whenever it routes to a host
expert; with ``off`` never. Such a call streams only the experts it routes to and
prefetches nothing: the next step's choice is not known yet.

The window's pairs count as device pairs (no host wait), and its experts' stored bytes as
``streamed_bytes`` (``ninfer_expert_streamed_bytes_total``). On a GPU the window is part of
the plan: given no ``window_bytes``, it takes ``default_window``, and the plan holds room for
two parts (the one computing and the next layer's prefetched one).

Overlap is GPU-only: while a layer computes, the next MoE layer's host experts are copied on
a second stream. ``prefetch`` is that hook: a backend offering
``prefetch_experts(artifact, groups)`` (start the copies, each group one expert's weight
names; its next ``prepare_streamed`` of those names finds them made) gets the next layer's
host experts, most chosen first, within the window. The CUDA backend offers it, and keeps
streamed experts in pinned host memory, side by side, so a window uploads in a few DMAs
(``backends/cuda/expert_streaming.py``); the CPU backend offers none (one stream, and its
"device" is host memory), so nothing overlaps there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import EngineError
from ..ops.moe.reference import expert
from ..sizes import format_size
from .settings import pinned_allowance
from .split_moe import expert_names, expert_prefix, prepare_experts, release_weights

log = logging.getLogger("ninfer.expert_offload")

if TYPE_CHECKING:
    from .split_moe import SplitMoe

Array = Any

#: token rows per block call above which the host experts a call routes to are streamed to
#: the device (a prefill chunk) rather than computed on the host (decode, small batches)
STREAM_ROWS = 32
#: the token rows of a prefill call while host experts stream, when the engine's prefill
#: chunk is smaller: each host expert a call routes to crosses the link once a call, so a
#: 7,680-token prompt in one call moves a quarter of the bytes it would in 2,048-token calls
#: (the workspace grows with the rows, planned like the engine's own chunk)
STREAM_CHUNK = 8192
#: ``ExpertStream.decode``'s choices, the default first (see the module docstring)
STREAM_DECODE = ("auto", "all", "off", "mapped")
#: a GPU's window, given none: this fraction of the budget (within one layer's routed experts
#: and at least its largest expert), so a window costs resident experts in proportion
WINDOW_SHARE = 1 / 16


def default_window(sizes: Mapping[int, Sequence[int]], budget: int) -> int:
    """The stored bytes a part of the window may take on a GPU, given none: ``WINDOW_SHARE``
    of ``budget``, at most the largest layer's routed experts (a chunk may route to all of
    them), at least the largest expert (a part holds one); ``sizes``: layer -> each
    expert's stored bytes."""
    layer = max(sum(per) for per in sizes.values())
    expert = max(max(per) for per in sizes.values())
    return min(layer, max(int(budget * WINDOW_SHARE), expert))


class ExpertStream:
    """The prefill window of a model's split MoE blocks (see the module docstring)."""

    def __init__(
        self,
        rows: int | None = STREAM_ROWS,
        window_bytes: int | None = None,
        blocks: Sequence[SplitMoe] = (),
        decode: str = STREAM_DECODE[0],
    ):
        """``rows``: the threshold (None: never stream); ``window_bytes``: the stored bytes a
        part of the window may take (None: no cap); ``blocks``: the split blocks in layer
        order (the list the offload fills as it attaches), for the next layer's prefetch;
        ``decode``: which calls of few rows stream on a GPU (``STREAM_DECODE``)."""
        if decode not in STREAM_DECODE:
            choices = ", ".join(STREAM_DECODE)
            raise EngineError(f"expert_stream_decode is {decode!r}; expected one of {choices}")
        self.rows, self.window_bytes, self.blocks = rows, window_bytes, blocks
        self.decode = decode
        self._given_window = window_bytes
        #: layer -> each routed expert's stored bytes (``WeightSizes.experts``, which the
        #: offload measures once while planning and sets here before any block is split)
        self.sizes: Mapping[int, Sequence[int]] = {}

    def device_room(self, backend: Any, budget: int) -> int:
        """Device bytes the window takes beyond a given ``window_bytes`` (planned with the
        offload's own workspace): on a backend that prefetches the next layer's experts while
        one computes (``prefetch_experts``: a GPU), the window is ``default_window`` unless
        given, and the prefetched part takes as much again; elsewhere nothing more."""
        if self.rows is None or not self.sizes or not hasattr(backend, "prefetch_experts"):
            return 0  # (no routed experts: a dense model, nothing streams)
        given = self._given_window
        self.window_bytes = given if given is not None else default_window(self.sizes, budget)
        return self.window_bytes if given is not None else 2 * self.window_bytes

    def keep_pinned(self, blocks: Sequence[SplitMoe]) -> None:
        """Tell a backend that keeps streamed experts in pinned host memory
        (``keep_streamed``) how much it may keep: the ``blocks``' host experts' stored bytes,
        within ``settings.pinned_allowance``."""
        keep = getattr(blocks[0].backend, "keep_streamed", None) if blocks else None
        if keep is None or self.rows is None:
            return
        stored = sum(self.sizes[b.layer][e] for b in blocks for e in b.on_host)
        allowance = min(stored, pinned_allowance())
        keep(allowance)
        log.info("streamed experts: up to %s kept in pinned host memory", format_size(allowance))

    def takes(self, rows: int) -> bool:
        """Whether a block call of ``rows`` token rows streams as a prefill chunk."""
        return self.rows is not None and rows > self.rows

    def spares_host_on(self, backend: Any) -> bool:
        """Whether calls of few rows on ``backend`` may stream their host experts: on a
        backend that streams on a second stream (a GPU), with streaming and ``decode`` on."""
        return (
            self.rows is not None
            and self.decode in ("auto", "all")
            and hasattr(backend, "prefetch_experts")
        )

    def maps_on(self, backend: Any) -> bool:
        """Whether calls of few rows on ``backend`` read the host experts in place: on a
        backend with ``prepare_mapped``, with ``decode`` mapped, or auto on a GPU (a backend
        that streams on a second stream, as ``spares_host_on`` tells one)."""
        gpu = hasattr(backend, "prefetch_experts")
        wanted = self.decode == "mapped" or (self.decode == "auto" and gpu)
        return wanted and hasattr(backend, "prepare_mapped")

    def spares_host(self, block: SplitMoe, top: np.ndarray) -> bool:
        """Whether a call of few rows (routed to ``top``) streams instead of computing on the
        host: where ``spares_host_on`` its backend and it routes to a host expert, any
        (``decode`` all) or one with no host kernel (``HostExpert.packed``), which the host
        would decode (a decoded copy is then never read: the offload holds none)."""
        if not self.spares_host_on(block.backend):
            return False
        held = block.host_experts
        chosen = [held[e] for e in set(top.ravel().tolist()) if e in held]
        return any(self.decode == "all" or h.packed is None for h in chosen)

    def streams_none(self, block: SplitMoe) -> bool:
        """Whether no call of few rows of ``block`` streams, whatever it routes to (what
        lets its host pairs be a step of the device's stream: ``SplitMoe.node_ready``)."""
        if not self.spares_host_on(block.backend):
            return True
        held = block.host_experts.values()
        return self.decode != "all" and all(h.packed is not None for h in held)

    def expert_bytes(self, block: SplitMoe, expert: int) -> int:
        """An expert's stored bytes (what a device copies), as the plan measured them."""
        return self.sizes[block.layer][expert]

    def parts(self, block: SplitMoe, window: Sequence[int]) -> list[list[int]]:
        """``window`` (expert indices, in order) cut into parts within ``window_bytes``."""
        parts: list[list[int]] = []
        used = 0
        for e in window:
            size = self.expert_bytes(block, e)
            if not parts or (self.window_bytes is not None and used + size > self.window_bytes):
                parts.append([])
                used = 0
            parts[-1].append(e)
            used += size
        return parts

    def __call__(
        self,
        block: SplitMoe,
        x: Array,
        top: np.ndarray,
        weights: np.ndarray,
        prefetch: bool = True,
    ) -> Array:
        """The block's output on rows ``x`` with every pair computed on the device: ``top``
        and ``weights`` [N, k] are the block's routing (host copies); ``prefetch``: start
        the next layer's copies (a prefill chunk's), or not (a decode step's)."""
        on_host = block.on_host
        window = [int(e) for e in np.unique(top) if int(e) in on_host]
        backend, inner, layer = block.backend, block.inner, block.layer
        out = None
        for part in self.parts(block, window) or [[]]:
            prepared = {
                name: weight
                for weights in prepare_experts(
                    backend, block.artifact, layer, part, streamed=True
                ).values()
                for name, weight in weights.items()
            }
            if out is None:  # the next layer's copies start once this layer's are made
                if prefetch:
                    self.prefetch(block)
                with placed(inner, layer, part, prepared):
                    out = inner(x)
            else:
                out = out + self._pairs(block, x, top, weights, part, prepared)
            release_weights(backend, prepared.values())
            del prepared  # released: the next part reuses the window's room
            block.counters.streamed_bytes += sum(self.expert_bytes(block, e) for e in part)
        computed = block.resident.copy()
        computed[window] = True
        block.counters.record(layer, top, computed, 0.0)
        return out

    def _pairs(
        self,
        block: SplitMoe,
        x: Array,
        top: np.ndarray,
        weights: np.ndarray,
        part: Sequence[int],
        prepared: Mapping[str, Any],
    ) -> Array:
        """``Σ weight · expert(x)`` over the pairs of ``part``'s experts, on the device."""
        xp, backend = block.backend.xp, block.backend
        out = xp.zeros_like(x)
        for e in part:
            rows, slot = np.nonzero(top == e)
            gate, up, down = (prepared[n] for n in expert_names(block.layer, e))
            share = xp.asarray(weights[rows, slot, None])
            at = xp.asarray(rows)
            out[at] += share * expert(backend, x[at], gate, up, down, block.inner.gated)
        return out

    def _after(self, block: SplitMoe) -> SplitMoe | None:
        """The split block after ``block`` in layer order (None: it is the last)."""
        later = [b for b in self.blocks if b.layer > block.layer]
        return min(later, key=lambda b: b.layer) if later else None

    def prefetch(self, block: SplitMoe) -> None:
        """Start copying the next split block's host experts to the device, most chosen
        first within the window, while ``block`` computes: the GPU's second stream, for a
        backend that offers ``prefetch_experts``; nothing on the CPU backend (see the module
        docstring). After the last block the backend is handed no experts, so it lets the
        last prefetch's unused ones go."""
        if not hasattr(block.backend, "prefetch_experts"):
            return
        after = self._after(block)
        groups: list[list[str]] = []
        if after is not None:
            hits = after.counters.layer_counts(after.layer)
            order = sorted(after.on_host, key=lambda e: (-hits[e], e))
            first = (self.parts(after, order) or [[]])[0]
            groups = [expert_names(after.layer, e) for e in first]
        block.backend.prefetch_experts(block.artifact, groups)


@contextmanager
def placed(
    inner: Any, layer: int, part: Sequence[int], prepared: Mapping[str, Any]
) -> Iterator[None]:
    """``inner``'s experts with ``part`` in place from ``prepared`` for the block's call, the
    block's own experts back afterwards."""
    own = list(inner.experts)
    if part:
        experts = list(own)
        for e in part:
            experts[e] = inner.expert(expert_prefix(layer, e), prepared)
        inner.experts = experts
    try:
        yield
    finally:
        inner.experts = own
