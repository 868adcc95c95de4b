"""A MoE block whose routed experts are split between device memory and host memory.

    top, share = route(x)                                   once, over all experts
    out = moe_resident(x) + Σ_{pairs on the host} share · expert(x)

``moe_resident`` is the backend's own MoE op over the block with the host's experts left
out (``None``, as under expert parallelism), so the resident experts and the shared expert
run exactly as they do without offload; the host adds the pairs of the experts it holds,
each weighted with the routing weight the router gave it over the full top-k (never
renormalised over a subset). Routing is the same function on both sides
(``array_ops.top_k_routing``); on the CPU backend the two routings are bit-identical.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..backends import Weight
from ..backends import array_ops as ops
from ..backends.base import ExpertWeights, to_numpy
from .counters import ExpertCounters
from .host_experts import HOST_MATH, HostCompute, HostExpert

Array = Any


def expert_prefix(layer: int, expert: int) -> str:
    return f"text/layers/{layer}/moe/experts/{expert}/"


def expert_names(layer: int, expert: int) -> list[str]:
    return [expert_prefix(layer, expert) + w for w in ("gate", "up", "down")]


class SplitMoe:
    """Wraps a layer's ``SparseMoe`` (whose weights hold the resident experts, the others
    ``None``) and computes the others' pairs on the host."""

    def __init__(
        self,
        layer: int,
        inner: Any,
        artifact: Any,
        host: HostCompute,
        counters: ExpertCounters,
    ):
        self.layer, self.inner, self.host, self.counters = layer, inner, host, counters
        self.backend = inner.backend
        self._artifact = artifact
        router = artifact.parameter(f"text/layers/{layer}/moe/router", in_order=True)
        self.router = np.ascontiguousarray(router, dtype=np.float32)
        self.top_k = inner.weights.top_k
        experts = inner.weights.experts
        self.device: dict[int, ExpertWeights] = {
            e: w for e, w in enumerate(experts) if w is not None
        }
        self.host_experts = {
            e: HostExpert.load(artifact, expert_prefix(layer, e))
            for e in range(len(experts))
            if e not in self.device
        }
        self.resident = np.zeros(len(experts), dtype=bool)
        self.resident[list(self.device)] = True

    @property
    def experts(self) -> int:
        return len(self.resident)

    def place(self, resident: tuple[int, ...], prepared: Mapping[str, Weight]) -> None:
        """Make exactly ``resident`` the device's experts: those newly resident from
        ``prepared`` (their weights prepared on the backend), the others back to host
        memory."""
        keep = set(resident)
        for e in range(self.experts):
            if e in keep and e not in self.device:
                self.device[e] = ExpertWeights(*(prepared[n] for n in expert_names(self.layer, e)))
                del self.host_experts[e]
            elif e not in keep and e in self.device:
                self.host_experts[e] = HostExpert.load(self._artifact, expert_prefix(self.layer, e))
                del self.device[e]
        self.resident[:] = False
        self.resident[list(keep)] = True
        experts = [self.device.get(e) for e in range(self.experts)]
        self.inner.weights = dataclasses.replace(self.inner.weights, experts=experts)

    def __call__(self, x: Array) -> Array:
        xh = np.ascontiguousarray(to_numpy(x), dtype=np.float32)
        probs = ops.softmax(HOST_MATH.linear(xh, self.router))
        top, share = ops.top_k_routing(probs, self.top_k)
        out = self.inner(x)
        start = time.perf_counter()
        part = self.host(xh, top, share, self.host_experts)
        self.counters.record(self.layer, top, self.resident, time.perf_counter() - start)
        return out if part is None else out + self.backend.xp.asarray(part)
