"""The weight bytes one decode step reads, from the artifact's stored sizes and the
architecture's description (``architectures``), for models that are not Qwen3.5's: every text
weight once, except gathered tables (the token embedding, PLE's n-gram tables: the rows the
step's tokens read) and routed experts (the distinct experts a batch touches, on average,
with uniform routing). Stored bytes are what a kernel reading the stored formats moves.

Per decoder layer too, so a reduced artifact's bytes extrapolate to the whole model's by
kind of layer, as its time does. The same walk counts the multiply-adds of a prefill's
projections (``flops``): every weight but the gathered tables, the routed experts ``top_k`` a
token.
"""

from __future__ import annotations

import math
from typing import Any

from ..expert_offload.plan import routed_expert, stored_bytes
from ..state import ContextPool
from .architectures import architecture_of


def _layer_of(name: str) -> int | None:
    parts = name.split("/")
    return int(parts[2]) if len(parts) > 2 and parts[1] == "layers" else None


class ActiveWeights:
    """Bytes a step of ``rows`` rows reads: ``outside(rows)`` (embedding rows, head, final
    norm or connection), ``layer(i, rows)``; calling it gives the total."""

    def __init__(self, artifact: Any):
        config = artifact.components["text"].config
        arch = architecture_of(config)
        g = arch.read(config)
        self.top_k = g.moe.top_k if getattr(g, "moe", None) is not None else 0
        gathered = arch.gathered(g)
        shapes = {s.name: s.shape for s in arch.parameters(config, ("text",), None)}
        self.layers = len(g.layer_types)
        #: per layer (None: outside the layers): bytes read whole, bytes of a gathered row a
        #: token reads (times how many rows), and each routed expert's bytes
        self.whole: dict[int | None, int] = {}
        self.row: dict[int | None, int] = {}
        self.experts: dict[int, dict[int, int]] = {}
        #: elements multiplied a token: every weight but gathered tables, and the routed
        #: experts' (``expert_elements``, per layer, summed over its experts)
        self.elements = 0
        self.expert_elements: dict[int, list[int]] = {}
        for name in shapes:
            size, layer = stored_bytes(artifact, name), _layer_of(name)
            where = routed_expert(name)
            suffix = next((s for s in gathered if name.endswith(s)), None)
            elements = math.prod(shapes[name])
            if where is not None:
                per = self.experts.setdefault(where[0], {})
                per[where[1]] = per.get(where[1], 0) + size
                counted = self.expert_elements.setdefault(where[0], [0, 0])
                counted[0] += elements
                counted[1] = len(per)
            elif suffix is not None:
                self.row[layer] = self.row.get(layer, 0) + gathered[suffix] * (
                    size // shapes[name][0]
                )
            else:
                self.whole[layer] = self.whole.get(layer, 0) + size
                self.elements += elements

    def _touched(self, layer: int, rows: int) -> float:
        experts = self.experts.get(layer)
        if not experts:
            return 0.0
        count = len(experts)
        touched = count * (1 - (1 - min(self.top_k, count) / count) ** rows)
        return touched * sum(experts.values()) / count

    def layer(self, index: int, rows: int) -> int:
        read = self.whole.get(index, 0) + rows * self.row.get(index, 0)
        return int(read + self._touched(index, rows))

    def outside(self, rows: int) -> int:
        return int(self.whole.get(None, 0) + rows * self.row.get(None, 0))

    def __call__(self, rows: int) -> int:
        return self.outside(rows) + sum(self.layer(i, rows) for i in range(self.layers))

    def flops(self, tokens: int) -> float:
        """Multiply-add FLOPs of the projections for ``tokens`` tokens (2 a weight a token;
        routed experts: ``top_k`` of each layer's); attention products are not counted."""
        routed = sum(
            min(self.top_k, count) * total / count for total, count in self.expert_elements.values()
        )
        return 2.0 * tokens * (self.elements + routed)


def active_weights(artifact: Any) -> ActiveWeights | None:
    """The description-driven count for every architecture but Qwen3.5 (None: its prepared
    weights are counted, as they always were)."""
    model_type = artifact.components["text"].config.get("model_type", "")
    return None if str(model_type).startswith("qwen3_5") else ActiveWeights(artifact)


def layer_context_bytes(model: Any, index: int, lanes: int, context: int, kv_dtype: str) -> int:
    """Layer ``index``'s share of a step's context bytes: its K/V pages up to ``context`` per
    lane, its recurrent slot read and written."""
    specs, _ = model.state_specs()
    spec = [specs[index]]
    return lanes * (
        context * ContextPool.page_bytes_of(spec, None, 1, kv_dtype)
        + 2 * ContextPool.slot_bytes_of(spec)
    )
