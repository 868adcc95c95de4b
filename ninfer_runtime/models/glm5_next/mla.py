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
from ...functional import by_query_blocks, query_block
from ...ops.attention.latent import LatentPages, LatentSpec
from ...ops.attention.pooled_keys import reads_chosen_tokens
from ...ops.linear import matmul
from ...ops.registry import resolve
from ..batch import Batch, token_bucket
from .indexer import PoolChoice, TokenIndexer

Array = Any


def memory_spec(m: Mla, indexer: DsaIndexer | None) -> LatentSpec:
    """What an attention layer keeps a token: its latent, and its indexer record when it runs
    an indexer of its own."""
    if indexer is None:
        return LatentSpec(m.kv_rank + m.rope_dim)
    return LatentSpec(m.kv_rank + m.rope_dim, indexer.head_dim, indexer.kpool)


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
        n = x.shape[0]
        down = be.linear(x, self.down)
        rms_norm = resolve("norm", "rms_norm", device=be.name)
        query_latent = rms_norm(down[:, : m.q_rank], self.query_norm, self.eps, offset=0.0)
        latent = rms_norm(down[:, m.q_rank :], self.kv_norm, self.eps, offset=0.0)
        q = be.linear(query_latent, self.query_up).reshape(n, m.heads, m.nope_dim)
        absorbed = matmul(q.swapaxes(0, 1), self.key_up).swapaxes(0, 1)  # [N, heads, rank]
        records = queries = weights = None
        if self.indexer is not None:
            records, queries, weights = self.indexer.project(x, query_latent)
        read = self._prompts if batch.decode is None else self._step
        context, choices = read(batch, memory, absorbed, latent, records, queries, weights, chosen)
        o = matmul(context.swapaxes(0, 1), self.value_up.swapaxes(1, 2)).swapaxes(0, 1)
        o = o.reshape(n, m.heads * m.value_dim)
        return be.linear(o, self.output), choices

    def _prompts(
        self, batch: Batch, memory: LatentPages, absorbed: Array, latent: Array,
        records: Array | None, queries: Array | None, weights: Array | None,
        chosen: list[PoolChoice] | None,
    ) -> tuple[Array, list[PoolChoice]]:  # fmt: skip
        """A prefill chunk's attention, lane by lane: each lane's choice of tokens, and its
        queries attending a block at a time (each block's mask made from that choice)."""
        xp = self.backend.xp
        lanes = [(lane.rows, lane.state.page_ids, lane.start) for lane in batch.lanes]
        for rows, pages, start in lanes:  # every row stored before any row reads
            memory.write(pages, start, latent[rows], None if records is None else records[rows])
            if self.indexer is not None:  # the keys of the pools the rows are in
                kp = self.indexer.n.kpool
                touched = xp.arange(start // kp, (rows.stop - rows.start + start - 1) // kp + 1)
                self.indexer.update_pools(memory, pages, touched)
        context = xp.empty(absorbed.shape, xp.float32)
        choices = []
        for i, (rows, pages, start) in enumerate(lanes):
            count = rows.stop - rows.start
            latents = memory.read(pages, start + count)
            positions = xp.arange(start, start + count)
            choice = self._choice(
                i, queries, weights, rows, memory, pages, positions, start + count, chosen
            )
            choices.append(choice)
            context[rows] = self._over(absorbed[rows], latents, choice)
        return context, choices

    def _step(
        self, batch: Batch, memory: LatentPages, absorbed: Array, latent: Array,
        records: Array | None, queries: Array | None, weights: Array | None,
        chosen: list[PoolChoice] | None,
    ) -> tuple[Array, list[PoolChoice]]:  # fmt: skip
        """A decode or verification step's rows together, each over its own sequence (row
        i: the token at ``positions[i]`` of slot ``slots[i]``): every row stored, then the
        sequences' pools scored up to the step's ``token_bucket`` (its variant; a step
        compiled without one reads the positions on the host for it), at most the pages a
        slot has (the pools past a sequence's length are never chosen), rows a block at a
        time; each row attends over the tokens it chose, gathered, where they are fewer than
        the bucket's (``reads_chosen_tokens``), else over the bucket under their mask."""
        d = batch.decode
        assert d is not None
        xp, m, n = self.backend.xp, self.m, absorbed.shape[0]
        pages, positions = d.page_table[d.slots], d.positions.astype(xp.int64)
        memory.write_rows(pages, positions, latent, records)
        if self.indexer is not None:  # each row's pool's key, from its records
            self.indexer.update_pools(memory, pages, positions // self.indexer.n.kpool)
        bucket = d.variant if d.variant is not None else token_bucket(max(d.host_positions))
        tokens = min(bucket, pages.shape[1] * memory.latent.shape[1])
        # a row reads its tokens' latents and its pools' keys, and scores the tokens
        width = memory.latent.shape[-1] + memory.index.shape[-1] // 2
        block = query_block(4 * tokens * (m.heads + width))
        context = xp.empty(absorbed.shape, xp.float32)
        pools = []
        for at in range(0, n, block):
            rows = slice(at, at + block)
            choice = self._choice(
                0, queries, weights, rows, memory, pages[rows], positions[rows], tokens, chosen
            )
            part = slice(None) if self.indexer is not None else rows
            if self.indexer is not None:
                pools.append(choice.pools)
            if reads_chosen_tokens(choice.selected, tokens):
                ids, seen = choice.chosen_tokens(part)
                latents = memory.read_at(pages[rows], ids)
            else:
                latents, seen = memory.read(pages[rows], tokens), choice.visible(part, tokens)
            context[rows] = self._attend(absorbed[rows], latents, seen)
        if self.indexer is None:
            return context, list(chosen or ())
        kpool = self.indexer.n.kpool
        return context, [PoolChoice(xp.concatenate(pools), positions, kpool)]

    def _choice(
        self, i: int, queries: Array | None, weights: Array | None, rows: slice,
        memory: LatentPages, pages: Array, positions: Array, reach: int,
        chosen: list[PoolChoice] | None,
    ) -> PoolChoice:  # fmt: skip
        """Group ``i``'s choice of tokens for its ``rows`` (at ``positions``, their sequences'
        page-table rows ``pages``): its indexer's over the keys of the pools within their
        sequences' first ``reach`` tokens, or a ``shared`` layer's ``chosen`` (whole)."""
        if self.indexer is not None:
            assert queries is not None and weights is not None
            assert memory.pools is not None
            keys = memory.pools.read(pages, reach)
            return self.indexer.choose(queries[rows], weights[rows], keys, positions)
        if chosen is None:
            raise ValueError("a shared attention layer needs the choice of the layer before")
        return chosen[i]

    def _over(self, absorbed: Array, latents: Array, choice: PoolChoice) -> Array:
        """One lane's queries over its latents, a block of queries at a time: each query
        over the tokens it chose, gathered, where they are fewer than the lane's
        (``reads_chosen_tokens``), else every query over all of them under its mask."""
        tokens, heads = latents.shape[0], self.m.heads
        if reads_chosen_tokens(choice.selected, tokens):
            per_query = 4 * choice.selected * (heads + latents.shape[1])

            def part(rows: slice) -> Array:
                ids, seen = choice.chosen_tokens(rows)
                return self._attend(absorbed[rows], latents[ids], seen)

        else:
            per_query = 4 * heads * tokens

            def part(rows: slice) -> Array:
                return self._attend(absorbed[rows], latents, choice.visible(rows, tokens))

        return by_query_blocks(absorbed.shape[0], query_block(per_query), part, self.backend.xp)

    def _attend(self, absorbed: Array, latents: Array, seen: Array) -> Array:
        attend = resolve("attention", "latent", device=self.backend.name)
        return attend(absorbed, latents, seen, scale=self.m.scaling)
