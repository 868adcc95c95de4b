"""Gated DeltaNet (Qwen3.5 ``linear_attn``), notes 5.5.

mixed   = [query x | key x | value x]            conv channels [q | k | v]
q, k, v = split(silu(causal_conv(mixed)))        depthwise, K taps, state = last K-1 inputs
q, k    = l2norm(q) / sqrt(dk), l2norm(k)
beta    = sigmoid(b x);  g = -exp(a_log) * softplus(a x + dt_bias)     (log-decay <= 0)
S_t     = exp(g_t) (I - beta_t k_t k_tᵀ) S_{t-1} + beta_t k_t v_tᵀ;  o_t = S_tᵀ q_t
          (value head h uses key head h // (Hv / Hk): repeat-interleave, never tiling)
out     = output (RMSNorm_plain(o; norm) * silu(z x))   (norm per head over dv)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...backends import Backend, Weight
from ...functional import log_decay, sigmoid
from ...ops import delta_rule
from ...ops.delta_rule.memory import GdnSlots
from ...ops.registry import resolve
from ..batch import Batch
from .config import GdnConfig

Array = Any


class GatedDeltaNet:
    def __init__(
        self,
        prefix: str,
        c: GdnConfig,
        eps: float,
        backend: Backend,
        weights: Mapping[str, Weight],
    ):
        p = prefix + "gdn/"
        self.c, self.eps, self.backend = c, eps, backend
        # every projection of the layer input as one product: [q | k | v] (the convolution's
        # channels), then z, b and a
        inputs = ("query", "key", "value", "z", "b_projection", "a_projection")
        self.projections = backend.join_rows([weights[p + s] for s in inputs])
        self.output = weights[p + "output"]
        self.a = -backend.xp.exp(backend.array(weights[p + "a_log"]))  # A = -exp(a_log)
        self.dt_bias = backend.array(weights[p + "dt_bias"])
        self.convolution = backend.array(weights[p + "convolution"])  # [K, conv_dim]
        self.norm = backend.array(weights[p + "norm"])

    @staticmethod
    def parameter_names(prefix: str) -> list[str]:
        p = prefix + "gdn/"
        return [
            p + s
            for s in (
                "query",
                "key",
                "value",
                "z",
                "output",
                "a_projection",
                "b_projection",
                "a_log",
                "dt_bias",
                "convolution",
                "norm",
            )
        ]

    def __call__(self, x: Array, batch: Batch, memory: GdnSlots) -> Array:
        be, c = self.backend, self.c
        xp, n = be.xp, x.shape[0]
        ends = np.cumsum([c.conv_channels, c.value_width, c.value_heads])
        # mixed: the [q | k | v] channels (a column slice: the backend's ops take it so)
        mixed, z, b, a = xp.split(be.linear(x, self.projections), ends, axis=-1)
        z = z.reshape(n, c.value_heads, c.value_dim)
        beta = sigmoid(b)
        g = log_decay(a, self.dt_bias, self.a)

        d = batch.decode
        if d is not None and d.tokens > 1:  # verification: states stay, inputs recorded
            o = self._op("verify")(
                mixed,
                self.convolution,
                memory.conv,
                g,
                beta,
                memory.recurrent,
                d.lane_slots,
                memory.drafts,
                tokens=d.tokens,
                **self._dims,
            )
        elif d is not None:  # one token per lane, states addressed by slot
            o = self._op("decode")(
                mixed,
                self.convolution,
                memory.conv,
                g,
                beta,
                memory.recurrent,
                d.slots,
                **self._dims,
            )
        else:  # a prefill chunk: every lane's rows in one call (a call a round with marks)
            o = batch.each_round(
                lambda pieces: self._op("prefill", rows=n)(
                    mixed,
                    self.convolution,
                    memory.conv,
                    g,
                    beta,
                    memory.recurrent,
                    tuple(piece.segment for piece in pieces),
                    **self._dims,
                ),
                (memory.recurrent, memory.conv),
            )

        y = resolve("norm", "gated_rms_norm", device=be.name)(o, z, self.norm, self.eps)
        return be.linear(y.reshape(n, c.value_width), self.output)

    def commit(self, memory: GdnSlots, slots: Array, counts: Array) -> None:
        """Fold the first ``counts[i]`` verified tokens of lane i (slot ``slots[i]``) into
        its states (see the delta_rule family's ``verify``)."""
        self._op("commit")(
            self.convolution,
            memory.conv,
            memory.recurrent,
            slots,
            memory.drafts,
            counts,
            **self._dims,
        )

    def _op(self, name: str, rows: int = 0) -> Any:
        """The delta_rule family's ``name`` op for this layer and a call of ``rows`` rows, as
        its policy resolves it."""
        return delta_rule.resolved(
            name, self.backend.name, self.convolution, rows=rows, **self._dims
        )

    @property
    def _dims(self) -> dict[str, int]:
        c = self.c
        return {
            "key_heads": c.key_heads,
            "key_dim": c.key_dim,
            "value_heads": c.value_heads,
            "value_dim": c.value_dim,
        }
