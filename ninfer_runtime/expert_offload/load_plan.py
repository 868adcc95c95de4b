"""Expert offload's plan while a model loads (``ExpertOffload.plan_load``, the engine's step
2): from the artifact's stored sizes, the backend's workspace at the prefill rows it will
run and the context pool's planned bytes, before any weight is prepared.

``LoadPlanning`` is a base of ``ExpertOffload``, its load-time methods kept in a room of
their own: they work on what ``ExpertOffload.__init__`` sets up (the budget, the given
workspace, the stream window, the prefill rows, the priority, the host compute).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..backends import decode_eagerly
from ..ops.registry import resolve
from .plan import (
    OffloadPlan,
    VramBudgetError,
    WeightSizes,
    backend_workspace,
    plan_residency,
    routed_expert,
)
from .split_moe import HOST_ROUTING

log = logging.getLogger("ninfer.expert_offload")


class LoadPlanning:
    """``ExpertOffload``'s plan while loading (see the module docstring)."""

    def plan_load(self, model: Any, artifact: Any, names: Sequence[str]) -> Callable[[str], bool]:
        """The first plan, before ``model`` prepares any of ``names`` (all the parameters it
        loads): from their stored sizes, the backend's workspace for the artifact's text
        config at ``prefill_rows`` and the context pool's planned bytes for the model's
        memory (``model.state_specs()``, so the model's config must be read by now).

        On a backend that captures decode steps as CUDA graphs, the first plan counts the
        graphs' workspace: where every routed expert fits beside them, the offload steps
        aside (``aside``): nothing is left to the split, the steps stay captured, and the
        model runs as it would without a budget. Otherwise, on a backend whose host nodes
        keep the split's steps capturable (``host_nodes``), or where the device reads the
        host experts in place (``ExpertStream.maps_on``), the steps stay captured (unless a
        split block cannot: ``attach``); on one without, decode steps turn eager
        (the split reads routing on the host). The plan is then made again with the prefill
        window; where it leaves host experts to stream, once more for prefill calls of
        ``stream_chunk`` rows if the engine's are fewer (``prefill_rows`` then says so, and
        the engine's prefill chunk follows). Returns which parameters to leave
        unprepared: none aside, else every routed expert of the text layers (``attach``
        prepares the resident ones, one expert at a time).
        ``VramBudgetError`` here costs no loading."""
        self._artifact = artifact
        self._sizes = WeightSizes.measure(artifact, names)
        self.stream.sizes = self._sizes.experts
        self._context = self.context_bytes(model) if self.context_bytes is not None else 0
        if getattr(model.backend, "graphs", False):
            self.plan = self._first_plan(model.backend, window=False)
            if self.plan.resident_fraction == 1:
                self.aside = True
                log.info("every routed expert fits beside captured decode steps: no split")
                return lambda name: False
        if not (getattr(model.backend, "host_nodes", False) or self.stream.maps_on(model.backend)):
            decode_eagerly(model.backend, HOST_ROUTING)
        self.host.kernel = resolve("moe", "host_products", device=model.backend.name)()
        self.plan = self._first_plan(model.backend, window=True)
        if self._streams() and self.stream_chunk > self.prefill_rows:
            self._plan_stream_chunk(model.backend)

        def left_to_the_split(name: str) -> bool:
            return routed_expert(name) is not None

        return left_to_the_split

    def most_resident(self, sizes: WeightSizes) -> int | None:
        """The most bytes of routed experts to keep in device memory (``resident_share``)."""
        share = self.resident_share
        return None if share is None else int(share * sizes.expert_total)

    def _plan_stream_chunk(self, backend: Any) -> None:
        """The plan again for prefill calls of ``stream_chunk`` rows; where the budget
        cannot hold their workspace, the engine's chunk and its plan stay."""
        rows, plan, workspace = self.prefill_rows, self.plan, self.workspace
        self.prefill_rows = self.stream_chunk
        try:
            self.plan = self._first_plan(backend, window=True)
        except VramBudgetError:
            self.prefill_rows, self.plan, self.workspace = rows, plan, workspace
            return
        log.info("host experts stream: prefill calls of %d rows", self.prefill_rows)

    def _streams(self) -> bool:
        """Whether the plan leaves routed experts in host memory for prefill to stream."""
        assert self.plan is not None
        return self.stream.rows is not None and self.plan.resident_fraction < 1

    def _first_plan(self, backend: Any, *, window: bool) -> OffloadPlan:
        """The plan beside the backend's workspace as it runs now, and with ``window`` the
        prefill window's room."""
        assert self._sizes is not None
        self.workspace = self._given_workspace + backend_workspace(
            backend, self._artifact, self.prefill_rows
        )
        if window:
            self.workspace += self.stream.device_room(backend, self.budget)
        return plan_residency(
            self._sizes,
            self.budget,
            workspace=self.workspace,
            context=self._context,
            counts=self.priority,
            most=self.most_resident(self._sizes),
        )
