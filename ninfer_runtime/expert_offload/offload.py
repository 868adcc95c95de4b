"""``--vram-budget``: a model's routed experts planned into a device-memory budget.

The engine drives it in three steps:

1. ``ExpertOffload.for_budget`` before loading: refuses what is not built (a GPU backend,
   tensor parallelism) in one line;
2. ``attach`` while the model loads (called by the model): the routed experts of the text
   layers are not prepared on the backend; each MoE block becomes a ``SplitMoe`` holding
   them in host memory;
3. ``start`` once the context pool exists (its bytes are part of the budget): plans with
   equal priorities (refusing a budget below the weights that must be resident), places,
   and with calibration on, counts routing over a short text and places again by those
   counts.

On the CPU backend the "device" is simulated: resident experts run as the backend's float32
weights, the others from their stored codes on the host path, which is what a test of the
split needs; the plan counts stored bytes, as a GPU would hold them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..backends.base import MoeWeights
from ..capacity import parse_size
from ..errors import EngineError
from .calibration import routing_counts
from .counters import ExpertCounters
from .host_experts import HostCompute
from .plan import OffloadPlan, WeightSizes, plan_residency, routed_expert
from .split_moe import SplitMoe, expert_names

log = logging.getLogger("ninfer.expert_offload")

#: the one line a GPU backend answers a budget with, until its split is built
GPU_NOT_BUILT = "expert offload on the GPU is not built yet"
#: the budget in MiB when neither ``--vram-budget`` nor ``[engine] vram_budget`` gives one
VRAM_BUDGET_ENV = "NINFER_VRAM_BUDGET_MIB"


def vram_budget_setting(
    given: str | int | None, environ: Mapping[str, str] = os.environ
) -> int | None:
    """The budget in bytes: ``given`` (a size such as ``8GiB``, ``512MiB``), else
    ``$NINFER_VRAM_BUDGET_MIB`` (a number of MiB); None: no budget, every expert resident."""
    if given is not None:
        return parse_size(given, "vram budget")
    value = environ.get(VRAM_BUDGET_ENV, "").strip()
    if not value:
        return None
    try:
        mib = float(value)
    except ValueError:
        raise EngineError(f"${VRAM_BUDGET_ENV} {value!r}: expected a number of MiB") from None
    if mib < 0:
        raise EngineError(f"${VRAM_BUDGET_ENV} {value!r} must not be negative")
    return int(mib * (1 << 20))


class ExpertOffload:
    """A model's routed experts split between device and host memory within a budget."""

    def __init__(
        self,
        budget: int,
        *,
        calibrate: bool = True,
        counts: Mapping[int, Sequence[float]] | None = None,
        workspace: int = 0,
        threads: int | None = None,
    ):
        """``counts``: a priority kept from earlier (layer -> hits per expert, e.g. a run's
        ``counters.counts()``), used instead of calibrating; ``workspace``: device bytes
        the backend needs beside weights and context (0 on the CPU)."""
        self.budget = budget
        self.calibrate = calibrate and counts is None
        self.priority = counts
        self.workspace = workspace
        self.host = HostCompute(threads)
        self.blocks: list[SplitMoe] = []
        self.counters = ExpertCounters({})
        self.plan: OffloadPlan | None = None
        self._artifact: Any = None
        self._names: list[str] = []
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
    ) -> ExpertOffload | None:
        """The offload a ``--vram-budget`` asks for (None: no budget, all resident)."""
        size = parse_size(budget, "vram budget")
        if size is None:
            return None
        name = backend if isinstance(backend, str) else getattr(backend, "name", "")
        if name != "cpu":
            raise EngineError(
                f"--vram-budget on --backend {name}: {GPU_NOT_BUILT} (it runs on the CPU "
                "backend, which simulates the split)"
            )
        if tensor_parallel > 1:
            raise EngineError("--vram-budget with --tensor-parallel is not built yet")
        return cls(size, calibrate=calibrate)

    # ------------------------------------------------------------------ while loading
    def held_on_host(self, name: str) -> bool:
        """Whether the model leaves parameter ``name`` unprepared (a text layer's routed
        expert weight: ``attach`` holds it)."""
        return routed_expert(name) is not None

    def attach(self, layers: Sequence[Any], artifact: Any, names: Sequence[str]) -> None:
        """Turn every MoE block of the text ``layers`` into a ``SplitMoe``; ``names`` are
        all the parameters the model loads (for the budget's other weights)."""
        self._artifact, self._names = artifact, list(names)
        moe = {
            i: len(layer.ffn.weights.experts)
            for i, layer in enumerate(layers)
            if isinstance(getattr(layer.ffn, "weights", None), MoeWeights)
        }
        self.counters = ExpertCounters(moe)
        for i in moe:
            layers[i].ffn = SplitMoe(i, layers[i].ffn, artifact, self.host, self.counters)
            self.blocks.append(layers[i].ffn)

    # ------------------------------------------------------------------ once the pool exists
    def start(
        self, runner: Any, encode: Callable[[str], Sequence[int]], context: int
    ) -> OffloadPlan:
        """Plan and place the experts in the budget beside a context pool of ``context``
        bytes; calibrate first if asked."""
        self._sizes = sizes = WeightSizes.measure(self._artifact, self._names)
        self._context = context
        plan = self._place(sizes, context, self.priority)
        if self.calibrate and self.blocks:
            counts = routing_counts(runner, self.counters, encode)
            plan = self._place(sizes, context, counts)
            self.priority = counts
        log.info(plan.summary())
        return plan

    def replan(self, counts: Mapping[int, Sequence[float]] | None = None) -> OffloadPlan:
        """Place the experts again by ``counts`` (None: the hits counted since load, the
        workload's own priority); between steps, as routing never depends on placement."""
        if self._sizes is None:
            raise EngineError("expert offload has not started: nothing to place again")
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
    ) -> OffloadPlan:
        plan = plan_residency(
            sizes, self.budget, workspace=self.workspace, context=context, counts=counts
        )
        fresh = [
            name
            for block in self.blocks
            for e in plan.resident.get(block.layer, ())
            if not block.resident[e]
            for name in expert_names(block.layer, e)
        ]
        backend = self.blocks[0].backend if self.blocks else None
        prepared = backend.prepare(self._artifact, fresh) if fresh and backend else {}
        for block in self.blocks:
            block.place(plan.resident.get(block.layer, ()), prepared)
        self.plan = plan
        decoded = sum(e.decoded for b in self.blocks for e in b.host_experts.values())
        if decoded:
            log.info("%d host experts are held decoded: their layout cannot be cut", decoded)
        return plan

    def host_bytes(self) -> int:
        """Host memory the host experts take now."""
        return sum(e.nbytes for b in self.blocks for e in b.host_experts.values())

    def resident_counts(self) -> np.ndarray:
        """Resident experts per MoE layer, in layer order."""
        return np.array([int(b.resident.sum()) for b in self.blocks])

    def close(self) -> None:
        self.host.close()
