"""Kimi Delta Attention (GLM5Next ``linear_attn`` layers): Gated DeltaNet's recurrence with one
decay per key channel, low-rank forget and output gates.

mixed   = [query x | key x | value x]            conv channels [q | k | v], H heads of d each
q, k, v = split(silu(causal_conv(mixed)))        depthwise, K taps, state = last K-1 inputs
q, k    = l2norm(q) / sqrt(d), l2norm(k)
f       = forget_up (forget_down x) + dt_bias    [N, H, d]: one value a key channel
g       = lower · sigmoid(exp(a_log) f)          with a lower bound (GLM5Next's), else
          -exp(a_log) · softplus(f)              (log-decay <= 0, per channel)
beta    = sigmoid(b x)
S_t     = diag(exp(g_t)) S_{t-1};  S_t += k_t (beta_t (v_t - S_tᵀ k_t))ᵀ;  o_t = S_tᵀ q_t
out     = output (RMSNorm(o; norm) · sigmoid(gate_up (gate_down x)))    (norm per head)

The recurrence is the delta_rule family's ``kda_*`` ops; its states are the family's memory
kind with ``channel_decay``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ninfer_format.binders.glm5_next_parts import Kda

from ...backends import Backend, Weight
from ...functional import mul_sigmoid, sigmoid
from ...ops import delta_rule
from ...ops.delta_rule.memory import GdnSlots, GdnSpec
from ...ops.registry import resolve
from ..batch import Batch

Array = Any
PARTS = (
    "query", "key", "value", "convolution", "forget_down", "forget_up", "dt_bias", "a_log",
    "b_projection", "gate_down", "gate_up", "norm", "output",
)  # fmt: skip


def memory_spec(k: Kda) -> GdnSpec:
    """What a KDA layer keeps per sequence: the recurrent state [H, d, d] and the last K-1
    convolution inputs, a per-channel decay recorded per row of a multi-row step."""
    return GdnSpec(k.heads, k.head_dim, k.head_dim, k.conv_channels, k.conv_kernel, True)


class KimiDeltaAttention:
    def __init__(
        self, prefix: str, k: Kda, eps: float, backend: Backend, weights: Mapping[str, Weight]
    ):
        p = prefix + "kda/"
        self.k, self.eps, self.backend = k, eps, backend
        # every projection of the layer input as one product: [q | k | v] (the convolution's
        # channels), the two gates' low-rank halves, then b
        inputs = ("query", "key", "value", "forget_down", "gate_down", "b_projection")
        self.projections = backend.join_rows([weights[p + s] for s in inputs])
        self.forget_up, self.gate_up = weights[p + "forget_up"], weights[p + "gate_up"]
        self.output = weights[p + "output"]
        xp = backend.xp
        self.decay_rate = xp.exp(backend.array(weights[p + "a_log"]))[:, None]  # [H, 1]
        self.dt_bias = backend.array(weights[p + "dt_bias"]).reshape(k.heads, k.head_dim)
        self.convolution = backend.array(weights[p + "convolution"])  # [K, 3W]
        self.norm = backend.array(weights[p + "norm"])

    @staticmethod
    def parameter_names(prefix: str) -> list[str]:
        return [f"{prefix}kda/{s}" for s in PARTS]

    def log_decay(self, f: Array) -> Array:
        """The forget gate's per-channel log-decay from f [N, H, d] (dt_bias added)."""
        xp, bound = self.backend.xp, self.k.lower_bound
        if bound is not None:
            return bound * sigmoid(self.decay_rate * f)
        return -self.decay_rate * xp.logaddexp(xp.float32(0), f)

    def __call__(self, x: Array, batch: Batch, memory: GdnSlots) -> Array:
        be, k = self.backend, self.k
        n, h, d = x.shape[0], k.heads, k.head_dim
        projected = be.linear(x, self.projections)
        ends = [k.conv_channels, k.conv_channels + d, k.conv_channels + 2 * d]
        mixed, forget_rank, gate_rank, b = be.xp.split(projected, ends, axis=-1)
        f = be.linear(forget_rank, self.forget_up).reshape(n, h, d) + self.dt_bias
        g, beta = self.log_decay(f), sigmoid(b)

        dims = {"heads": h, "head_dim": d}
        step = batch.decode
        if step is not None and step.tokens > 1:  # verification: states stay, rows recorded
            o = self._op("kda_verify")(
                mixed, self.convolution, memory.conv, g, beta, memory.recurrent,
                step.lane_slots, memory.drafts, tokens=step.tokens, **dims,
            )  # fmt: skip
        elif step is not None:  # one token per lane, states addressed by slot
            o = self._op("kda_decode")(
                mixed, self.convolution, memory.conv, g, beta, memory.recurrent, step.slots,
                **dims,
            )  # fmt: skip
        else:
            o = batch.each_piece(
                lambda lane, rows: self._op("kda_prefill")(
                    mixed[rows], self.convolution, memory.conv[lane.state.slot],
                    g[rows], beta[rows], memory.recurrent[lane.state.slot], **dims,
                ),
                (memory.recurrent, memory.conv),
                be.xp,
            )  # fmt: skip
        gate = be.linear(gate_rank, self.gate_up).reshape(n, h, d)
        rms_norm = resolve("norm", "rms_norm", device=be.name)
        y = mul_sigmoid(rms_norm(o, self.norm, self.eps, offset=0.0), gate)
        return be.linear(y.reshape(n, k.width), self.output)

    def commit(self, memory: GdnSlots, slots: Array, counts: Array) -> None:
        """Fold the first ``counts[i]`` verified rows of lane i (slot ``slots[i]``) into its
        states."""
        dims = {"heads": self.k.heads, "head_dim": self.k.head_dim}
        self._op("kda_commit")(
            self.convolution, memory.conv, memory.recurrent, slots, memory.drafts, counts, **dims
        )

    def _op(self, name: str) -> Any:
        d = self.k.head_dim
        return delta_rule.resolved(
            name, self.backend.name, self.convolution, key_dim=d, value_dim=d
        )
