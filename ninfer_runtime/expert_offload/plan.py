"""Which routed experts stay in device memory under a ``--vram-budget``.

The budget holds, in this order: the weights that are not routed experts (in their stored
sizes, as a device holds them), the backend's workspace (scratch, captured graphs), the
context pool, and then as many routed experts as fit. The experts that do not fit stay in
host memory in their stored format (``host_experts``) and the CPU computes their share.

Which experts stay is a static priority: per-expert routing counts (a calibration pass at
load, ``calibration``, or counts the engine kept) make the experts most often chosen per
byte resident first; without counts every expert counts the same, and the experts go
resident in rounds, each layer's next one before any layer's one after it, so the layers'
residency stays even. Routing never changes: the plan only decides where each expert's
share of the block's output is computed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer_format.schema import WholeBinding

from ..errors import EngineError
from ..logprobs import PROMPT_LOGPROB_CHUNK
from ..sizes import format_size

#: a routed expert's weight in a text layer (MTP experts stay with the other weights)
ROUTED_EXPERT = re.compile(r"^text/layers/(\d+)/moe/experts/(\d+)/(gate|up|down)$")


class VramBudgetError(EngineError):
    """The budget cannot hold what must be on the device; the message names the smallest
    budget that would."""


def routed_expert(name: str) -> tuple[int, int] | None:
    """``(layer, expert)`` of a routed expert's weight, None for any other parameter."""
    m = ROUTED_EXPERT.match(name)
    return (int(m[1]), int(m[2])) if m else None


def stored_bytes(artifact: Any, name: str) -> int:
    """The stored bytes of a parameter: its object's, or its parts' shares of theirs (a
    packed expert bank's bytes shared out by elements)."""
    binding = artifact.bindings[name]
    if isinstance(binding, WholeBinding):
        return int(artifact.objects[binding.object].bytes)
    total = 0
    for part in binding.parts:
        obj = artifact.objects[part.object]
        total += math.ceil(obj.bytes * part.elements / max(obj.elements, 1))
    return total


@dataclass(frozen=True)
class WeightSizes:
    """Stored bytes of what a model loads: each routed expert's (gate, up and down) by
    layer, and everything else together."""

    experts: Mapping[int, Sequence[int]]  # layer -> bytes of each expert (index = expert)
    other: int

    @classmethod
    def measure(cls, artifact: Any, names: Iterable[str]) -> WeightSizes:
        experts: dict[int, dict[int, int]] = {}
        other = 0
        for name in dict.fromkeys(names):  # a name listed twice is loaded once
            where = routed_expert(name)
            if where is None:
                other += stored_bytes(artifact, name)
            else:
                layer, expert = where
                per = experts.setdefault(layer, {})
                per[expert] = per.get(expert, 0) + stored_bytes(artifact, name)
        tables = {
            layer: [per[e] for e in range(max(per) + 1)] for layer, per in sorted(experts.items())
        }
        for layer, per in experts.items():
            if len(per) != len(tables[layer]):
                raise EngineError(f"text/layers/{layer}/moe/experts: expert indices have gaps")
        return cls(tables, other)

    @property
    def expert_total(self) -> int:
        return sum(sum(per) for per in self.experts.values())


@dataclass(frozen=True)
class OffloadPlan:
    """Where each routed expert lives, and the budget's shares."""

    budget: int
    weights: int  # the weights other than routed experts
    workspace: int
    context: int  # the context pool
    resident: Mapping[int, tuple[int, ...]]  # layer -> its experts in device memory, sorted
    experts: Mapping[int, int]  # layer -> its routed experts
    resident_bytes: int
    host_bytes: int

    def host(self, layer: int) -> tuple[int, ...]:
        """The experts of ``layer`` kept in host memory."""
        kept = set(self.resident.get(layer, ()))
        return tuple(e for e in range(self.experts.get(layer, 0)) if e not in kept)

    @property
    def resident_fraction(self) -> float:
        total = sum(self.experts.values())
        return sum(len(r) for r in self.resident.values()) / total if total else 1.0

    def summary(self) -> str:
        """One line for the start-up log."""
        held = sum(len(r) for r in self.resident.values())
        total = sum(self.experts.values())
        return (
            f"vram budget {format_size(self.budget)}: {held} of {total} routed experts in "
            f"device memory ({self.resident_fraction:.0%}, {format_size(self.resident_bytes)}), "
            f"{format_size(self.host_bytes)} of them in host memory; other weights "
            f"{format_size(self.weights)}, workspace {format_size(self.workspace)}, context "
            f"pool {format_size(self.context)}"
        )


def expert_order(counts: Sequence[float]) -> list[int]:
    """A layer's experts most chosen first, the lower index first among equals."""
    return sorted(range(len(counts)), key=lambda e: (-counts[e], e))


def plan_residency(
    sizes: WeightSizes,
    budget: int,
    *,
    workspace: int = 0,
    context: int = 0,
    counts: Mapping[int, Sequence[float]] | None = None,
    most: int | None = None,
) -> OffloadPlan:
    """The routed experts that fit in ``budget`` beside the other weights, the workspace and
    the context pool, chosen by ``counts`` (layer -> routing count per expert; None: equal),
    at most ``most`` bytes of them (None: what the budget holds); ``VramBudgetError`` when
    even none fit."""
    floor = sizes.other + workspace + context
    if budget < floor:
        whole = (  # a model without routed experts has nothing to place beyond the floor
            f", all routed experts resident from {format_size(floor + sizes.expert_total)}"
            if sizes.expert_total
            else "; this model has no routed experts to keep in host memory"
        )
        raise VramBudgetError(
            f"--vram-budget {format_size(budget)} is below what must be in device memory "
            f"(weights other than the routed experts {format_size(sizes.other)}, workspace "
            f"{format_size(workspace)}, context pool {format_size(context)}): the smallest "
            f"budget that works is {format_size(floor)} ({floor} bytes){whole}"
        )
    room = budget - floor if most is None else min(budget - floor, most)
    candidates = []
    for layer, per in sizes.experts.items():
        layer_counts = (counts or {}).get(layer)
        if layer_counts is None:
            layer_counts = np.ones(len(per))
        elif len(layer_counts) != len(per):
            raise EngineError(
                f"expert counts of layer {layer}: {len(layer_counts)} values for {len(per)} experts"
            )
        for rank, e in enumerate(expert_order(layer_counts)):
            # most hits per byte first; among equals each layer's next expert in turn
            density = float(layer_counts[e]) / max(per[e], 1)
            candidates.append((-density, rank, layer, e))
    resident: dict[int, list[int]] = {layer: [] for layer in sizes.experts}
    used = 0
    for _, _, layer, e in sorted(candidates):
        size = sizes.experts[layer][e]
        if used + size <= room:
            resident[layer].append(e)
            used += size
    return OffloadPlan(
        budget=budget,
        weights=sizes.other,
        workspace=workspace,
        context=context,
        resident={layer: tuple(sorted(r)) for layer, r in resident.items()},
        experts={layer: len(per) for layer, per in sizes.experts.items()},
        resident_bytes=used,
        host_bytes=sizes.expert_total - used,
    )


def backend_workspace(backend: Any, artifact: Any, rows: int) -> int:
    """The device bytes ``backend`` states it needs beside the weights and the context pool
    for prefill calls of ``rows`` token rows of the artifact's text model, at most
    ``PROMPT_LOGPROB_CHUNK`` of them scored (a scored prompt reads alone, in chunks that
    long): its ``device_workspace(text_config, rows, logit_rows)`` (the CUDA backend's
    scratch, activations and logits, ``backends/cuda/workspace.py``; the CPU's simulated
    device, 0)."""
    config = artifact.components["text"].config or {}
    return int(backend.device_workspace(config, rows, min(rows, PROMPT_LOGPROB_CHUNK)))
