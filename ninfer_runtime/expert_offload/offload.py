"""``--vram-budget``: a model's routed experts planned into a device-memory budget.

The engine drives it in four steps:

1. ``ExpertOffload.for_budget`` before loading: refuses what is not served (a backend not in
   ``OFFLOAD_BACKENDS``, tensor parallelism) in one line; the engine then gives it
   ``context_bytes``, the bytes its context pool will take for a model's memory kinds
   (``ContextPool.planned_bytes``);
2. ``plan_load``, called by the model before it prepares any weight: plans from the
   artifact's stored sizes, the backend's workspace at the engine's prefill chunk
   (``backend_workspace``) and the pool's planned bytes (refusing a budget below what must
   be resident, before anything is loaded). Where every routed expert fits beside captured
   decode steps, the offload steps aside (``aside``: no split, the model runs as without a
   budget); otherwise decode steps turn eager where the split must read each block's routing
   on the host every step (a backend without host nodes, or a block whose host experts the
   host has no kernel for: ``split_moe``; not where the device reads the host experts in
   place, ``--expert-stream-decode mapped``), the plan is made again with the prefill window,
   and the model leaves every routed expert of the text layers unprepared;
3. ``attach`` once the model's layers exist: each MoE block (``split_moe.SplittableMoe``)
   becomes a ``SplitMoe``, which prepares the plan's resident experts one expert at a time
   (each its own device window on CUDA) and holds the others in host memory;
4. ``start`` once the context pool exists: with calibration on, counts routing over a
   short text and places the experts again by those counts.

On the CPU backend the "device" is simulated: resident experts run as the backend's float32
weights, the others from their stored codes on the host path, which is what a test of the
split needs; the plan counts stored bytes, as a GPU would hold them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..backends import decode_eagerly
from ..capacity import parse_size
from ..errors import EngineError
from ..sizes import format_size
from .calibration import routing_counts
from .counters import ExpertCounters
from .host_cache import hold_by_layer
from .host_experts import HostCompute
from .load_plan import LoadPlanning
from .plan import OffloadPlan, WeightSizes, plan_residency
from .settings import host_cache_setting
from .split_moe import HOST_ROUTING, SplitMoe, SplittableMoe
from .stream_window import STREAM_CHUNK, STREAM_DECODE, STREAM_ROWS, ExpertStream

log = logging.getLogger("ninfer.expert_offload")

#: the backends expert offload is served on (cuda since tests/gpu/test_expert_offload_cuda.py
#: passed on a GPU: the resident experts in windows of their own, streamed windows released)
OFFLOAD_BACKENDS = ("cpu", "cuda")
#: the one line a backend outside ``OFFLOAD_BACKENDS`` answers a budget with
NOT_SERVED = "expert offload is not served on this backend"
#: the token rows of a prefill call when the engine does not give its prefill chunk (the
#: default chunk of ``ModelRunner.prefill``; an engine gives its own)
PREFILL_ROWS = 512


class ExpertOffload(LoadPlanning):
    """A model's routed experts split between device and host memory within a budget."""

    def __init__(
        self,
        budget: int,
        *,
        calibrate: bool = True,
        counts: Mapping[int, Sequence[float]] | None = None,
        workspace: int = 0,
        threads: int | None = None,
        host_cache: int | str | None = None,
        stream_rows: int | None = STREAM_ROWS,
        stream_window: int | None = None,
        prefill_rows: int = PREFILL_ROWS,
        stream_chunk: int = STREAM_CHUNK,
        stream_decode: str = STREAM_DECODE[0],
        resident_share: float | None = None,
    ):
        """``counts``: a priority kept from earlier (layer -> hits per expert, e.g. a run's
        ``counters.counts()``), used instead of calibrating; ``workspace``: device bytes to
        plan beside weights and context besides the backend's own, which ``plan_load`` adds
        for prefill calls of ``prefill_rows`` rows (the engine's prefill chunk);
        ``host_cache``: host bytes for decoded copies of the host experts routing chooses
        most (``[engine] host_expert_cache``; None: a quarter of the available memory, 0:
        none);
        ``stream_rows``: the prefill window's threshold (``stream_window``), ``stream_window``
        its device bytes, planned as workspace (None: no cap, as the CPU's simulated device);
        ``stream_chunk``: the prefill rows planned instead of a smaller ``prefill_rows``
        where host experts stream (``plan_load``); ``stream_decode``: which decode calls
        stream their host experts on a GPU (``stream_window.STREAM_DECODE``);
        ``resident_share``: the most of the routed experts' bytes kept in device memory, as a
        share (a benchmark's reduced artifact given the share the whole model keeps within
        its budget: ``bench/cli_load.py``; None: what the budget holds)."""
        self.budget = budget
        self.resident_share = resident_share
        self.calibrate = calibrate and counts is None
        self.priority = counts
        #: the token rows of the engine's prefill calls, as planned: its prefill chunk, or
        #: ``stream_chunk`` where host experts stream (the engine takes it after loading)
        self.prefill_rows = prefill_rows
        self.stream_chunk = stream_chunk
        #: the device bytes planned beside weights and context: ``workspace`` and the stream
        #: window, and from ``plan_load`` on the backend's own (``backend_workspace``)
        self.workspace = self._given_workspace = workspace + (stream_window or 0)
        self.host = HostCompute(threads)
        #: host bytes for decoded float32 copies of the hottest host experts
        self.host_cache = host_cache_setting(host_cache)
        self.blocks: list[SplitMoe] = []
        self.stream = ExpertStream(stream_rows, stream_window, self.blocks, stream_decode)
        self.counters = ExpertCounters({})
        self.plan: OffloadPlan | None = None
        #: whether the offload stepped aside: every routed expert fits beside captured decode
        #: steps, so the model runs as without a budget (``plan_load``)
        self.aside = False
        #: the context pool's bytes for a model's memory (set by the engine before loading;
        #: None: no pool in the budget)
        self.context_bytes: Callable[[Any], int] | None = None
        self._artifact: Any = None
        self._sizes: WeightSizes | None = None
        self._context = 0

    @classmethod
    def for_budget(
        cls,
        budget: int | str | None,
        backend: Any,
        *,
        tensor_parallel: int = 1,
        calibrate: bool = True,
        host_cache: int | str | None = None,
        stream_rows: int | None = None,
        prefill_rows: int | None = None,
        stream_chunk: int | None = None,
        stream_decode: str | None = None,
        resident_share: float | None = None,
    ) -> ExpertOffload | None:
        """The offload a ``--vram-budget`` asks for (None: no budget, all resident);
        ``stream_rows`` None: ``STREAM_ROWS``; ``prefill_rows``: the engine's prefill chunk
        (None: ``PREFILL_ROWS``); ``stream_chunk`` None: ``STREAM_CHUNK``; ``stream_decode``
        None: ``STREAM_DECODE[0]``; ``resident_share`` as ``ExpertOffload`` takes it."""
        size = parse_size(budget, "vram budget")
        if size is None:
            return None
        name = backend if isinstance(backend, str) else getattr(backend, "name", "")
        if name not in OFFLOAD_BACKENDS:
            raise EngineError(
                f"--vram-budget on --backend {name}: {NOT_SERVED} (served on: "
                f"{', '.join(OFFLOAD_BACKENDS)})"
            )
        if tensor_parallel > 1:
            raise EngineError("--vram-budget with --tensor-parallel is not built yet")
        rows = STREAM_ROWS if stream_rows is None else stream_rows
        return cls(
            size,
            calibrate=calibrate,
            host_cache=host_cache,
            stream_rows=rows,
            prefill_rows=PREFILL_ROWS if prefill_rows is None else prefill_rows,
            stream_chunk=STREAM_CHUNK if stream_chunk is None else stream_chunk,
            stream_decode=STREAM_DECODE[0] if stream_decode is None else stream_decode,
            resident_share=resident_share,
        )

    def attach(self, layers: Sequence[Any]) -> None:
        """Turn every MoE block of the text ``layers`` (``layer.ffn``, its routed experts
        left unprepared by ``plan_load``) into a ``SplitMoe`` holding the plan's resident
        experts on the device."""
        if self.plan is None:
            raise EngineError("expert offload: attach before plan_load")
        if self.aside:  # every expert was prepared with the model: nothing to split
            return
        moe = {
            i: len(layer.ffn.experts)
            for i, layer in enumerate(layers)
            if isinstance(getattr(layer, "ffn", None), SplittableMoe)
        }
        self.counters = ExpertCounters(moe)
        for i in moe:
            resident = self.plan.resident.get(i, ())
            split = SplitMoe(
                i, layers[i].ffn, self._artifact, self.host, self.counters, self.stream, resident
            )
            layers[i].ffn = split
            self.blocks.append(split)
        held = {b.layer: tuple(np.flatnonzero(b.resident)) for b in self.blocks}
        if held != {layer: tuple(r) for layer, r in self.plan.resident.items() if layer in held}:
            raise EngineError("expert offload: the model prepared other experts than planned")
        if not self.calibrate:  # with calibration, ``start`` holds copies by its counts
            self._hold_hottest(self.priority)
        self.host.log_forms(self.blocks)
        mapped = [(b.layer, e) for b in self.blocks for e in b.mapped]
        if mapped:
            pinned = sum(self._sizes.experts[layer][e] for layer, e in mapped) if self._sizes else 0
            log.info(
                "%d host experts read in place by the device (%s pinned)",
                len(mapped), format_size(pinned),
            )  # fmt: skip
        self.stream.keep_pinned(self.blocks)
        if self.blocks and not all(b.captures for b in self.blocks):
            decode_eagerly(self.blocks[0].backend, HOST_ROUTING)

    # ------------------------------------------------------------------ once the pool exists
    def start(
        self, runner: Any, encode: Callable[[str], Sequence[int]], context: int
    ) -> OffloadPlan:
        """With the context pool made (``context`` bytes: as planned, else the experts are
        placed again beside what it took), calibrate if asked and place again by the
        counts."""
        if self._sizes is None or self.plan is None:
            raise EngineError("expert offload: start before plan_load")
        plan = self.plan
        if self.aside:
            if context > self._context:  # nothing can leave the device now: say so
                log.warning(
                    "the context pool took %d bytes, not the %d planned: %d bytes over the "
                    "budget", context, self._context, context - self._context,
                )  # fmt: skip
            log.info(plan.summary())
            return plan
        calibrating = self.calibrate and bool(self.blocks)
        if context != self._context:
            log.warning(
                "the context pool took %d bytes, not the %d planned", context, self._context
            )
            self._context = context
            # calibrating: its counts decide the decoded copies (as attach left none for it)
            plan = self._place(self._sizes, context, self.priority, hold=not calibrating)
        if calibrating:
            counts = routing_counts(runner, self.counters, encode)
            plan = self._place(self._sizes, context, counts)
            self.priority = counts
        log.info(plan.summary())
        return plan

    def replan(self, counts: Mapping[int, Sequence[float]] | None = None) -> OffloadPlan:
        """Place the experts again by ``counts`` (None: the hits counted since load, the
        workload's own priority); between steps, as routing never depends on placement."""
        if self._sizes is None or self.plan is None:
            raise EngineError("expert offload has not started: nothing to place again")
        if self.aside:  # every expert is resident and stays so
            return self.plan
        counts = self.counters.counts() if counts is None else counts
        plan = self._place(self._sizes, self._context, counts)
        self.priority = counts
        log.info(plan.summary())
        return plan

    def _place(
        self,
        sizes: WeightSizes,
        context: int,
        counts: Mapping[int, Sequence[float]] | None,
        hold: bool = True,
    ) -> OffloadPlan:
        """Place the experts by ``counts``; ``hold``: and decoded copies for the hottest host
        experts by them."""
        plan = plan_residency(
            sizes,
            self.budget,
            workspace=self.workspace,
            context=context,
            counts=counts,
            most=self.most_resident(sizes),
        )
        for block in self.blocks:
            block.place(plan.resident.get(block.layer, ()))
        self.plan = plan
        if hold:
            self._hold_hottest(counts)
        self.host.log_forms(self.blocks)
        return plan

    def _hold_hottest(self, counts: Mapping[int, Sequence[float]] | None) -> None:
        # where kernel-less host experts stream in every call (a GPU), no use reads a copy,
        # nor where the device reads a block's host experts in place
        spared = bool(self.blocks) and self.stream.spares_host_on(self.blocks[0].backend)
        computing = [b for b in self.blocks if not b.maps]
        held = hold_by_layer(computing, counts, 0 if spared else self.host_cache)
        log.info("host expert cache: %s of decoded experts", format_size(held))

    def host_bytes(self) -> int:
        """Host memory the host experts take now: their stored form and the decoded copies
        of the hottest."""
        return sum(e.nbytes + e.held_bytes for b in self.blocks for e in b.host_experts.values())

    def resident_counts(self) -> np.ndarray:
        """Resident experts per MoE layer, in layer order."""
        return np.array([int(b.resident.sum()) for b in self.blocks])

    def close(self) -> None:
        self.host.close()
