"""Feed-forward blocks: the dense gated MLP and the Qwen3.5-MoE block (notes 5.6-5.7).

dense: down(silu(gate x) * up x)
MoE:   p = softmax(router x) over all experts; top-k of p renormalised to sum 1;
       routed = Σ_j p_j expert_j(x);  out = routed + sigmoid(shared_score x) * shared(x)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ...backends import Backend, ExpertWeights, MoeWeights, Weight
from ...backends import array_ops as ops
from ...functional import silu_mul
from ...ops.registry import resolve
from .config import MoeConfig

Array = Any


class DenseMlp:
    def __init__(self, prefix: str, backend: Backend, weights: Mapping[str, Weight]):
        p = prefix + "mlp/"
        self.backend = backend
        self.gate_up = backend.join_rows([weights[p + "gate"], weights[p + "up"]])
        self.down = weights[p + "down"]

    @staticmethod
    def parameter_names(prefix: str) -> list[str]:
        return [f"{prefix}mlp/{s}" for s in ("gate", "up", "down")]

    def __call__(self, x: Array) -> Array:
        be = self.backend
        return be.gated_linear(be.linear(x, self.gate_up), self.down)


class SparseMoe:
    """Routing and expert math live in the moe family's ``block`` (``ops/moe``) so a GPU
    provider can group tokens by expert; this class only assembles the block's weights (the
    experts this rank does not hold, under expert parallelism, as None; so too the experts
    not prepared at all, which expert offload holds in host memory,
    ``expert_offload.SplitMoe``, through ``route``, ``experts``, ``expert``, ``gated`` and
    ``hits``)."""

    def __init__(self, prefix: str, m: MoeConfig, backend: Backend, weights: Mapping[str, Weight]):
        p = prefix + "moe/"
        self.backend = backend
        expert = self.expert
        self.weights = MoeWeights(
            router=weights[p + "router"],
            experts=[
                expert(f"{p}experts/{e}/", weights) if f"{p}experts/{e}/gate" in weights else None
                for e in range(m.experts)
            ],
            shared=expert(p + "shared/", weights),
            shared_score=weights[p + "shared_score"],
            top_k=m.top_k,
        )

    @staticmethod
    def parameter_names(prefix: str, m: MoeConfig) -> list[str]:
        p = prefix + "moe/"
        names = [p + "router", p + "shared_score"]
        for q in [*(f"{p}experts/{e}/" for e in m.held), p + "shared/"]:
            names += [q + "gate", q + "up", q + "down"]
        return names

    def __call__(self, x: Array) -> Array:
        block = resolve("moe", "block", device=self.backend.name)
        return block(self.backend, x, self.weights)

    # ------------------------------------------------ what expert offload's split reads
    def route(self, x: Array) -> tuple[Array, Array]:
        """Rows x [N, H] -> their experts [N, k] and routing weights [N, k]: the routing the
        moe family's ``block`` computes inside (the same functions, so the same choice)."""
        choose = resolve("moe", "route", device=self.backend.name)
        return choose(ops.softmax(self.backend.linear(x, self.weights.router)), self.weights.top_k)

    @property
    def experts(self) -> Sequence[ExpertWeights | None]:
        """The routed experts this block computes (None: held elsewhere)."""
        return self.weights.experts

    @experts.setter
    def experts(self, experts: Sequence[ExpertWeights | None]) -> None:
        self.weights = dataclasses.replace(self.weights, experts=list(experts))

    @property
    def hits(self) -> Array | None:
        """A device array [E] each routed pair is added to (None: uncounted)."""
        return self.weights.hits

    @hits.setter
    def hits(self, hits: Array | None) -> None:
        self.weights = dataclasses.replace(self.weights, hits=hits)

    @staticmethod
    def expert(prefix: str, weights: Mapping[str, Weight]) -> ExpertWeights:
        """The expert whose prepared weights are ``prefix`` + gate, up, down."""
        return ExpertWeights(
            weights[prefix + "gate"], weights[prefix + "up"], weights[prefix + "down"]
        )

    @staticmethod
    def gated(gate: Array, up: Array) -> Array:
        """A routed expert's product of its gate and up rows, ``silu(gate x) * up x``, as the
        ``block`` computes it."""
        return silu_mul(gate, up)
