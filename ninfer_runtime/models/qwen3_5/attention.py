"""Gated full attention (Qwen3.5 ``self_attn``), notes 5.3-5.4.

q, gate = query x, gate x            (HF interleaves them per head in q_proj; the artifact
                                      stores them as two logical matrices)
q, k    = RMSNorm_1p per head, then partial NeoX RoPE on the first rotary_dim dims
o       = softmax(q kᵀ / sqrt(D) + causal) v     (GQA: head j reads kv head j // group)
out     = output (o * sigmoid(gate))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...backends import Backend, Weight
from ...functional import mul_sigmoid
from ...ops import attention
from ...ops.attention.memory import AttentionPages
from ...ops.registry import resolve
from ..batch import Batch, Lane
from .config import AttentionConfig
from .mrope import rope_streams

Array = Any


class Rotary:
    """cos/sin tables for positions: inv_freq_i = theta^(-2i/rd), pairs (i, i + rd/2).

    Qwen3.5's multimodal RoPE gives each frequency pair a temporal, height or width position
    (mrope.py): positions are [3, T], or [T] for text, where all three streams are the token
    index and the interleaved sections collapse to plain 1-D RoPE. Angles are computed in
    float64 on the host; decode steps gather rows of a device table (``table``) so their
    positions never leave the device.
    """

    def __init__(self, a: AttentionConfig, xp: Any):
        self.xp = xp
        rd = a.rotary_dim
        self.inv_freq = 1.0 / a.rope_theta ** (np.arange(0, rd, 2, dtype=np.float64) / rd)
        self.streams = rope_streams(a.mrope_section, rd // 2)
        self._table: tuple[Array, Array] = (xp.zeros((0, rd), xp.float32),) * 2

    def host(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos/sin [T, rd] of positions [T] (every stream the same) or [3, T]."""
        streams = np.broadcast_to(positions, (3, positions.shape[-1]))
        angles = streams[self.streams].T.astype(np.float64) * self.inv_freq[None, :]
        angles = np.concatenate([angles, angles], axis=-1)
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def __call__(self, positions: np.ndarray) -> tuple[Array, Array]:
        cos, sin = self.host(positions)
        return self.xp.asarray(cos), self.xp.asarray(sin)

    def table(self, positions: int) -> tuple[Array, Array]:
        """Device cos/sin rows for positions ``0 .. positions - 1`` (grown, never shrunk)."""
        if self._table[0].shape[0] < positions:
            cos, sin = self.host(np.arange(positions))
            self._table = (self.xp.asarray(cos), self.xp.asarray(sin))
        return self._table


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
        # the four projections of the layer input as one product: [query | gate | key | value]
        inputs = ("query", "gate", "key", "value")
        self.projections = backend.join_rows([weights[p + s] for s in inputs])
        self.output = weights[p + "output"]
        self.query_norm = backend.array(weights[p + "query_norm"])
        self.key_norm = backend.array(weights[p + "key_norm"])

    @staticmethod
    def parameter_names(prefix: str) -> list[str]:
        p = prefix + "attention/"
        return [
            p + s for s in ("query", "gate", "key", "value", "output", "query_norm", "key_norm")
        ]

    def __call__(self, x: Array, batch: Batch, memory: AttentionPages) -> Array:
        be, a = self.backend, self.a
        n, scale = x.shape[0], a.head_dim**-0.5
        width, kv_width = a.heads * a.head_dim, a.kv_heads * a.head_dim
        ends = np.cumsum([width, width, kv_width])
        q, gate, k, v = be.xp.split(be.linear(x, self.projections), ends, axis=-1)
        q = q.reshape(n, a.heads, a.head_dim)
        k = k.reshape(n, a.kv_heads, a.head_dim)
        v = v.reshape(n, a.kv_heads, a.head_dim)
        rms_norm = resolve("norm", "rms_norm", device=be.name)
        q = be.rope(rms_norm(q, self.query_norm, self.eps, offset=1.0), batch.cos, batch.sin)
        k = be.rope(rms_norm(k, self.key_norm, self.eps, offset=1.0), batch.cos, batch.sin)

        if batch.decode is not None:  # one token per lane, every lane at once
            d = batch.decode
            self._op("write", memory)(memory.k, memory.v, d.page_table, d.slots, d.positions, k, v)
            o = self._op("decode", memory)(
                q, memory.k, memory.v, d.page_table, d.slots, d.positions, scale=scale
            )
        else:  # a prefill chunk: every lane's rows stored at once, then read over their pages
            self._store_rows(batch, k, v, memory)
            o = self._prefill(batch, q, memory, scale)
        return be.linear(mul_sigmoid(o.reshape(n, a.heads * a.head_dim), gate), self.output)

    def _store_rows(self, batch: Batch, k: Array, v: Array, memory: AttentionPages) -> None:
        """A prefill chunk's keys and values, every lane's, in one call (the decode step's
        store, each row at its own slot and position)."""
        slots, positions, page_table = batch.row_addresses
        self._op("write", memory)(memory.k, memory.v, page_table, slots, positions, k, v)

    def _prefill(self, batch: Batch, q: Array, memory: AttentionPages, scale: float) -> Array:
        """The lanes' queries over their pages (their keys and values stored): one lane
        through ``prefill``, several through ``prefill_lanes`` (one call where a provider
        packs them)."""
        if len(batch.lanes) == 1:
            return self._lane_prefill(batch.lanes[0], q, memory, scale)
        return self._op("prefill_lanes", memory)(
            q, memory.k, memory.v, batch.page_lanes, scale=scale, precision=self._precision,
            one_lane=self._op("prefill", memory),
        )  # fmt: skip

    def _lane_prefill(self, lane: Lane, q: Array, memory: AttentionPages, scale: float) -> Array:
        """One lane's queries over its pages (its keys and values stored)."""
        return self._op("prefill", memory)(
            q[lane.rows], memory.k, memory.v, lane.state.page_ids, start=lane.start,
            scale=scale, precision=self._precision,
        )  # fmt: skip

    @property
    def _precision(self) -> str:
        """The backend's prefill precision (a backend without the choice computes in float32)."""
        return getattr(self.backend, "prefill_precision", "float32")

    def _op(self, name: str, memory: AttentionPages) -> Any:
        """The attention family's ``name`` op for this layer's pools, as its policy resolves
        it."""
        group = self.a.heads // self.a.kv_heads
        return attention.resolved(
            name, self.backend.name, memory.k, precision=self._precision, group=group
        )
