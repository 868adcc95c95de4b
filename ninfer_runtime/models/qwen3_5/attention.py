"""Gated full attention (Qwen3.5 ``self_attn``), notes 5.3-5.4.

q, gate = query x, gate x            (HF interleaves them per head in q_proj; the artifact
                                      stores them as two logical matrices)
q, k    = RMSNorm_1p per head, then partial NeoX RoPE on the first rotary_dim dims
o       = softmax(q kᵀ / sqrt(D) + causal) v     (GQA: head j reads kv head j // group)
out     = output (o * sigmoid(gate))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...backends import Backend, Weight
from ...state import KvCache
from ..batch import Batch
from ..functional import sigmoid
from .config import AttentionConfig

Array = Any


class Rotary:
    """cos/sin tables for positions: inv_freq_i = theta^(-2i/rd), pairs (i, i + rd/2).

    Qwen3.5's multimodal RoPE gives each frequency slot a T, H or W position; for text all
    three are the token index, so the interleaved sections collapse to plain 1-D RoPE.
    """

    def __init__(self, a: AttentionConfig, xp: Any):
        self.xp = xp
        rd = a.rotary_dim
        self.inv_freq = 1.0 / a.rope_theta ** (np.arange(0, rd, 2, dtype=np.float64) / rd)

    def __call__(self, positions: np.ndarray) -> tuple[Array, Array]:
        angles = positions.astype(np.float64)[:, None] * self.inv_freq[None, :]
        angles = np.concatenate([angles, angles], axis=-1)
        cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        return self.xp.asarray(cos), self.xp.asarray(sin)


class GatedAttention:
    def __init__(
        self,
        prefix: str,
        a: AttentionConfig,
        eps: float,
        backend: Backend,
        weights: Mapping[str, Weight],
    ):
        p = prefix + "attention/"
        self.a, self.eps, self.backend = a, eps, backend
        self.query, self.gate = weights[p + "query"], weights[p + "gate"]
        self.key, self.value = weights[p + "key"], weights[p + "value"]
        self.output = weights[p + "output"]
        self.query_norm = backend.array(weights[p + "query_norm"])
        self.key_norm = backend.array(weights[p + "key_norm"])

    @staticmethod
    def parameter_names(prefix: str) -> list[str]:
        p = prefix + "attention/"
        return [
            p + s for s in ("query", "gate", "key", "value", "output", "query_norm", "key_norm")
        ]

    def __call__(self, x: Array, batch: Batch, caches: Sequence[KvCache]) -> Array:
        be, a = self.backend, self.a
        n = x.shape[0]
        q = be.linear(x, self.query).reshape(n, a.heads, a.head_dim)
        gate = be.linear(x, self.gate)
        k = be.linear(x, self.key).reshape(n, a.kv_heads, a.head_dim)
        v = be.linear(x, self.value).reshape(n, a.kv_heads, a.head_dim)
        q = be.rope(be.rms_norm(q, self.query_norm, self.eps, offset=1.0), batch.cos, batch.sin)
        k = be.rope(be.rms_norm(k, self.key_norm, self.eps, offset=1.0), batch.cos, batch.sin)

        o = be.xp.empty_like(q)
        for lane, cache in zip(batch.lanes, caches, strict=True):
            slots = slice(lane.start, lane.start + lane.tokens)
            cache.k[slots] = k[lane.rows]
            cache.v[slots] = v[lane.rows]
            o[lane.rows] = be.attention(
                q[lane.rows], cache.k, cache.v, start=lane.start, scale=a.head_dim**-0.5
            )
        return be.linear(o.reshape(n, a.heads * a.head_dim) * sigmoid(gate), self.output)
