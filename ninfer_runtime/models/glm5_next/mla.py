"""Multi-head latent attention with a token indexer (GLM5Next ``indexed_attention`` layers).

q_lat  = RMSNorm(query_down x; query_norm)          [N, q_rank]
q_h    = (query_up q_lat)_h                         [N, heads, nope]  (NoPE: no rotated part)
c      = RMSNorm(kv_down x; kv_norm)                [N, kv_rank]: what the pages keep a token
k_h    = key_up_h c,   v_h = value_up_h c           (never formed: see below)
o_h    = softmax_{s chosen}(q_h · k_h,s / sqrt(nope)) v_h,s
out    = output [o_1 | … | o_heads]

The key expansion is folded into the query (q̃_h = key_up_hᵀ q_h, [N, heads, kv_rank]), so
attention runs over the cached latents themselves (the attention family's ``latent`` op) and
its output, still a latent, is expanded once by value_up. Which tokens a query sees is the
indexer's choice (``indexer.py``), or the layer before's on a ``shared`` layer. Attention
reads a group's queries a block at a time, each block's mask made from that choice, so its
scores and mask stay bounded at any context length (``functional.query_block``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ninfer_format.binders.glm5_next_parts import DsaIndexer, Mla

from ...backends import Backend, Weight
from ...ops.attention.latent import LatentPages, LatentSpec
from ...ops.registry import resolve
from ..batch import Batch
from ..functional import query_block
from .indexer import PoolChoice, TokenIndexer

Array = Any
#: a query group: (its rows, its sequence's page ids, the position of its first row)
Group = tuple[slice, Array, int]


def memory_spec(m: Mla, indexer: DsaIndexer | None) -> LatentSpec:
    """What an attention layer keeps a token: its latent, and its indexer record when it runs
    an indexer of its own."""
    return LatentSpec(m.kv_rank + m.rope_dim, indexer.head_dim if indexer else 0)


class LatentAttention:
    def __init__(
        self,
        prefix: str,
        m: Mla,
        indexer: DsaIndexer | None,
        eps: float,
        backend: Backend,
        weights: Mapping[str, Weight],
    ):
        p = prefix + "mla/"
        self.m, self.eps, self.backend = m, eps, backend
        self.down = backend.join_rows([weights[p + "query_down"], weights[p + "kv_down"]])
        self.query_norm = backend.array(weights[p + "query_norm"])
        self.kv_norm = backend.array(weights[p + "kv_norm"])
        self.query_up = weights[p + "query_up"]
        rank = m.kv_rank
        self.key_up = backend.array(weights[p + "key_up"]).reshape(m.heads, m.nope_dim, rank)
        self.value_up = backend.array(weights[p + "value_up"]).reshape(m.heads, m.value_dim, rank)
        self.output = weights[p + "output"]
        self.indexer = TokenIndexer(prefix, indexer, backend, weights) if indexer else None

    @staticmethod
    def parameter_names(prefix: str, with_indexer: bool) -> list[str]:
        parts = ("query_down", "query_norm", "query_up", "kv_down", "kv_norm", "key_up")
        names = [f"{prefix}mla/{s}" for s in (*parts, "value_up", "output")]
        return names + (TokenIndexer.parameter_names(prefix) if with_indexer else [])

    def __call__(
        self, x: Array, batch: Batch, memory: LatentPages, chosen: list[PoolChoice] | None
    ) -> tuple[Array, list[PoolChoice]]:
        """Rows x [N, H] -> (the layer's output [N, H], each query group's choice of
        tokens, which a following ``shared`` layer reuses as ``chosen``)."""
        be, m = self.backend, self.m
        xp, n = be.xp, x.shape[0]
        down = be.linear(x, self.down)
        rms_norm = resolve("norm", "rms_norm", device=be.name)
        query_latent = rms_norm(down[:, : m.q_rank], self.query_norm, self.eps, offset=0.0)
        latent = rms_norm(down[:, m.q_rank :], self.kv_norm, self.eps, offset=0.0)
        q = be.linear(query_latent, self.query_up).reshape(n, m.heads, m.nope_dim)
        absorbed = xp.einsum("nhd,hdr->nhr", q, self.key_up)
        records = queries = weights = None
        if self.indexer is not None:
            records, queries, weights = self.indexer.project(x, query_latent)
        groups = self._groups(batch)
        for rows, pages, start in groups:  # every row stored before any row reads
            memory.write(pages, start, latent[rows], None if records is None else records[rows])

        attend = resolve("attention", "latent", device=be.name)
        context = xp.empty(absorbed.shape, xp.float32)
        choices = []
        for i, (rows, pages, start) in enumerate(groups):
            count = rows.stop - rows.start
            latents, stored = memory.read(pages, start + count)
            if self.indexer is not None:
                positions = xp.arange(start, start + count)
                choice = self.indexer.choose(queries[rows], weights[rows], stored, positions)
            elif chosen is not None:
                choice = chosen[i]
            else:
                raise ValueError("a shared attention layer needs the choice of the layer before")
            choices.append(choice)
            tokens = latents.shape[0]
            block = query_block(4 * m.heads * tokens)
            for at in range(0, count, block):
                part = slice(at, min(at + block, count))
                into = slice(rows.start + part.start, rows.start + part.stop)
                seen = choice.visible(part, tokens)
                context[into] = attend(absorbed[into], latents, seen, scale=m.scaling)
        o = xp.einsum("nhr,hvr->nhv", context, self.value_up).reshape(n, m.heads * m.value_dim)
        return be.linear(o, self.output), choices

    @staticmethod
    def _groups(batch: Batch) -> list[Group]:
        """The batch's queries by sequence: a prefill chunk's lanes, or each row of a step
        addressed by slot (the reference reads the indices on the host)."""
        d = batch.decode
        if d is None:
            return [(lane.rows, lane.state.page_ids, lane.start) for lane in batch.lanes]
        slots, positions = d.host_slots, d.host_positions
        return [
            (slice(i, i + 1), d.page_table[slot], position)
            for i, (slot, position) in enumerate(zip(slots, positions, strict=True))
        ]
