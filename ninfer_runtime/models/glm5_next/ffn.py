"""GLM5Next's feed-forward blocks: a SwiGLU MLP whose gate and up are clamped (``dense``
layers, the shared experts), and the grouped sigmoid-routed MoE (``sparse`` layers).

mlp(x)  = down(silu(min(gate x, L)) · clamp(up x, -L, L))          L = swiglu_limit
moe(x)  = Σ_{e in top-k} w_e · expert_e(x) + shared(x)
routing: s = sigmoid(router x) (over all experts); c = s + router_bias chooses: the
         ``topk_groups`` groups with the best sum of their two best c, then the top-k experts
         of c inside them; w_e = s_e (renormalised to sum 1 if norm_topk_prob)
         · routed_scaling_factor (the moe family's ``grouped_route``, ``ops/moe``)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ninfer_format.binders.glm5_next_parts import Routing
from ninfer_format.binders.qwen3_5_geometry import Moe

from ...arrays import array_module
from ...backends import Backend, Weight
from ...backends.array_ops import count_pairs
from ...functional import silu_mul
from ...ops.registry import resolve

Array = Any


def clamped_silu_mul(gate: Array, up: Array, limit: float) -> Array:
    """``silu(min(gate, L)) · clamp(up, -L, L)``: GLM's SwiGLU product at ``limit`` L."""
    xp = array_module(gate)
    return silu_mul(xp.minimum(gate, limit), xp.clip(up, -limit, limit))


class ClampedMlp:
    """``P gate``, ``P up`` [I, H], ``P down`` [H, I], gate and up clamped at ``limit``."""

    def __init__(self, prefix: str, limit: float, backend: Backend, weights: Mapping[str, Weight]):
        self.limit, self.backend = limit, backend
        self.gate_up = backend.join_rows([weights[prefix + "gate"], weights[prefix + "up"]])
        self.down = weights[prefix + "down"]

    @staticmethod
    def parameter_names(prefix: str) -> list[str]:
        return [prefix + s for s in ("gate", "up", "down")]

    def __call__(self, x: Array) -> Array:
        be = self.backend
        gate, up = array_module(x).split(be.linear(x, self.gate_up), 2, axis=-1)
        return be.linear(clamped_silu_mul(gate, up, self.limit), self.down)


class GroupedMoe:
    """``P moe/router`` [E, H] and ``P moe/router_bias`` [E], the routed experts
    ``P moe/experts/e/``, the shared experts as one MLP ``P moe/shared/``."""

    def __init__(
        self,
        prefix: str,
        moe: Moe,
        routing: Routing,
        limit: float,
        backend: Backend,
        weights: Mapping[str, Weight],
    ):
        p = prefix + "moe/"
        self.moe, self.routing, self.limit, self.backend = moe, routing, limit, backend
        self.router = weights[p + "router"]
        self.router_bias = backend.array(weights[p + "router_bias"])
        #: the routed experts this block computes; None: not prepared (expert offload holds
        #: it in host memory, ``expert_offload.SplitMoe``)
        self.experts: list[ClampedMlp | None] = [
            self.expert(f"{p}experts/{e}/", weights) if f"{p}experts/{e}/gate" in weights else None
            for e in range(moe.experts)
        ]
        self.shared = ClampedMlp(p + "shared/", limit, backend, weights)
        #: a device array [E] each routed pair is added to (None: uncounted)
        self.hits: Array | None = None

    @staticmethod
    def parameter_names(prefix: str, moe: Moe) -> list[str]:
        p = prefix + "moe/"
        names = [p + "router", p + "router_bias"]
        for q in [*(f"{p}experts/{e}/" for e in range(moe.experts)), p + "shared/"]:
            names += ClampedMlp.parameter_names(q)
        return names

    def route(self, x: Array) -> tuple[Array, Array]:
        """Rows x [N, H] -> their experts [N, k] and weights [N, k]."""
        r, m, be = self.routing, self.moe, self.backend
        choose = resolve("moe", "grouped_route", device=be.name)
        return choose(
            be.linear(x, self.router),
            self.router_bias,
            groups=r.groups,
            topk_groups=r.topk_groups,
            top_k=m.top_k,
            norm_topk_prob=r.norm_topk_prob,
            scale=r.scale,
        )

    def __call__(self, x: Array) -> Array:
        """The shared experts, then the routed ones it holds (expert offload adds the pairs
        of those held in host memory) through the moe family's ``routed_experts``."""
        top, weights = self.route(x)
        count_pairs(self.hits, top)
        out = self.shared(x)
        routed = resolve("moe", "routed_experts", device=self.backend.name)
        routed(self.backend, x, top, weights, self.experts, out=out)
        return out

    # ------------------------------------------------ what expert offload's split reads
    def expert(self, prefix: str, weights: Mapping[str, Weight]) -> ClampedMlp:
        """The routed expert whose prepared weights are ``prefix`` + gate, up, down."""
        return ClampedMlp(prefix, self.limit, self.backend, weights)

    def gated(self, gate: Array, up: Array) -> Array:
        """A routed expert's product of its gate and up rows (``ClampedMlp``'s)."""
        return clamped_silu_mul(gate, up, self.limit)
