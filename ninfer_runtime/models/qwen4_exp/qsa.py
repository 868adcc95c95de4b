"""QSA: attention layers whose queries attend over a chosen subset of the context.

A token indexer scores blocks of ``compress_ratio`` consecutive tokens for each query and keeps
the best ``budget / compress_ratio`` complete blocks, plus the query's own incomplete block
(its "tail"); the gated attention of Qwen3.5 (``qwen3_5.attention``) then attends over the
selected tokens only. Below the budget every visible token is selected: plain causal
attention.

    iq      = RoPE(RMSNorm_1p per head (indexer/query x))      [T, n, d]  (the token's position)
    raw     = indexer/key x                                    [T, d]     kept per token in pages
    key_b   = RoPE(RMSNorm_1p(mean of raw over block b))       at the block's first token's
                                                               position (its RoPE rows, kept)
    score_b = Σ_heads relu(iq · key_b) / sqrt(d)               over blocks complete at the query
    keep    = top blocks by score ∪ the tail, ∩ causal

Rotation covers the attention's rotary width (the first ``rotary_dim`` dims of each index
head), with the attention's frequencies. A token's position is what the batch's RoPE rows say
(after an image: its M-RoPE position, three streams), so each token's rows are kept beside its
raw key (``memory.IndexedAttentionPages.index_rope``) for the block that starts with it.

While a query has at most ``block_topk`` complete blocks behind it, the selection keeps them
all and its tail: every visible token. Calls whose last query is still there (every prompt
and context up to about the budget) take the attention family's plain causal ops, the same
math without the indexer's scores; past it, the scores, the selection and the masked
attention run on the backend's arrays (their products the linear family's ``matmul``). A
decode or verification step is told which by its variant (``Qwen4Exp.step_variant``: from
the positions the host knows, part of the compiled step's key): past the budget each row
reads its sequence's first ``token_bucket`` tokens (the rows past its position are never
selected), so no step reads its positions back and a decode step may be captured as a CUDA
graph while a row's blocks rank on the device (``functional.ranked_rows``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ninfer_format.binders.qwen4_exp_parts import Indexer

from ...arrays import array_module
from ...backends import Backend, Weight
from ...backends.array_ops import softmax
from ...functional import (
    by_query_blocks,
    mul_sigmoid,
    query_block,
    top_k_ids,
    top_k_mask,
)
from ...kv_storage import gather_kv, gather_kv_at
from ...ops.attention import pooled_keys
from ...ops.linear import matmul
from ...ops.registry import resolve
from ..batch import Batch
from ..qwen3_5.attention import AttentionConfig, GatedAttention
from .memory import IndexedAttentionPages, rope_halves, rope_rows

Array = Any


def block_keys(
    raw: Array, cos: Array, sin: Array, ratio: int, norm: Array, eps: float, backend: Backend
) -> Array:
    """The complete blocks' keys of raw index keys [..., S, d] -> [..., S // ratio, d]: each
    block's mean, normed, rotated at the block's first token (``cos``, ``sin`` [..., S, rd]:
    the tokens' RoPE rows)."""
    *lead, tokens, d = raw.shape
    blocks = tokens // ratio
    if not blocks:
        return backend.xp.zeros((*lead, 0, d), backend.xp.float32)
    means = raw[..., : blocks * ratio, :].reshape(-1, ratio, d).mean(axis=1)
    normed = resolve("norm", "rms_norm", device=backend.name)(means, norm, eps, offset=1.0)
    first = slice(0, blocks * ratio, ratio)
    rd = cos.shape[-1]
    cos, sin = cos[..., first, :].reshape(-1, rd), sin[..., first, :].reshape(-1, rd)
    return backend.rope(normed[:, None, :], cos, sin)[:, 0].reshape(*lead, blocks, d)


def block_scores(queries: Array, keys: Array) -> Array:
    """Each query's score of each block [T, B]: Σ over its heads of relu(q · key_b) / sqrt(d),
    for queries [T, n, d] and block keys [B, d] (or [T, B, d]: each query's own)."""
    xp = array_module(queries)
    scores = xp.maximum(matmul(queries, keys.swapaxes(-1, -2)), 0).sum(axis=1)
    return scores / np.float32(np.sqrt(queries.shape[-1]))


def selection(
    queries: Array, keys: Array, positions: np.ndarray, length: int, indexer: Indexer
) -> Array:
    """Which of tokens ``0 .. length - 1`` each query attends to -> bool [T, length].

    ``queries`` [T, n, d] are the index queries of the tokens at ``positions`` (ints, either
    device), ``keys`` [B, d] the complete blocks' keys of their sequence, or [T, B, d]: each
    query's own (a step's rows; the blocks past a query are never kept). A query at p scores
    the blocks complete at p, keeps the ``block_topk`` best (all of them when there are no
    more) and its tail: the tokens after its last complete block."""
    xp, r = array_module(queries), indexer.compress_ratio
    blocks = keys.shape[-2]
    complete = xp.asarray((positions + 1) // r)  # blocks complete at each query [T]
    token = xp.arange(length)
    keep = token[None, :] >= (complete * r)[:, None]  # the tail (and the future, cut below)
    if blocks:  # (no block complete yet: the tail is everything, and no empty sort is asked)
        scores = block_scores(queries, keys)
        block = xp.arange(blocks)
        scores = xp.where(block[None, :] < complete[:, None], scores, -xp.inf)
        chosen = top_k_mask(scores, indexer.block_topk) & (block[None, :] < complete[:, None])
        keep[:, : blocks * r] |= xp.repeat(chosen, r, axis=1)
    return keep & (token[None, :] <= xp.asarray(positions)[:, None])


def chosen_tokens(
    queries: Array, keys: Array, positions: Array, indexer: Indexer
) -> tuple[Array, Array]:
    """``selection``'s choice as each query's tokens: ids int [T, J] and bool visible [T, J]
    (J = (``block_topk`` + 1) · ``compress_ratio``): its kept blocks' tokens, then its
    tail's (``pooled_keys.chosen_tokens``)."""
    xp, r = array_module(queries), indexer.compress_ratio
    positions = xp.asarray(positions)
    behind = xp.arange(keys.shape[-2])[None, :] < ((positions + 1) // r)[:, None]  # complete
    best = top_k_ids(xp.where(behind, block_scores(queries, keys), -xp.inf), indexer.block_topk)
    kept = xp.take_along_axis(behind, best, axis=1)  # fewer behind than kept: not all are
    return pooled_keys.chosen_tokens(best, kept, positions, r)


def masked_attention(q: Array, k: Array, v: Array, visible: Array, scale: float) -> Array:
    """GQA of q [T, Nq, D] over k, v [S, Nkv, D] (or [T, S, Nkv, D]: each query's own)
    where ``visible`` [T, S] -> [T, Nq, D]."""
    xp = array_module(q)
    t, nq, d = q.shape
    nkv = k.shape[-2]
    if k.ndim == 4:  # each query over its own keys: [T, Nkv, group, D] against [T, Nkv, D, S]
        qg = q.reshape(t, nkv, nq // nkv, d)
        scores = matmul(qg, k.transpose(0, 2, 3, 1)) * np.float32(scale)  # [T, Nkv, group, S]
        scores = xp.where(visible[:, None, None, :], scores, -xp.inf)
        out = matmul(softmax(scores), v.transpose(0, 2, 1, 3))  # [T, Nkv, group, D]
        return out.reshape(t, nq, d)
    qg = q.reshape(t, nkv, nq // nkv, d).transpose(1, 2, 0, 3)  # [Nkv, group, T, D]
    scores = matmul(qg, k.transpose(1, 2, 0)[:, None]) * np.float32(scale)  # [Nkv, group, T, S]
    scores = xp.where(visible, scores, -xp.inf)
    out = matmul(softmax(scores), v.transpose(1, 0, 2)[:, None])  # [Nkv, group, T, D]
    return out.transpose(2, 0, 1, 3).reshape(t, nq, d)


#: a step's variant (``Qwen4Exp.step_variant``) whose rows all select every token they see:
#: the plain causal ops, no read of the positions; ``SELECTED``: the indexer's path
ALL, SELECTED = "all", "selected"


def selects_all(indexer: Any, position: int) -> bool:
    """Whether a query at ``position`` (and so every earlier one) selects every token it
    sees: no more complete blocks behind it than ``indexer`` keeps."""
    return (position + 1) // indexer.compress_ratio <= indexer.block_topk


class IndexedAttention(GatedAttention):
    """Qwen3.5's gated attention with the QSA indexer (``L indexer/…`` parameters)."""

    def __init__(
        self,
        prefix: str,
        a: AttentionConfig,
        indexer: Indexer,
        eps: float,
        backend: Backend,
        weights: Mapping[str, Weight],
    ):
        super().__init__(prefix, a, eps, backend, weights)
        p, q = prefix + "attention/", prefix + "indexer/"
        self.indexer = indexer
        # one product of the layer input: [query | gate | key | value | index query | index key]
        inputs = [p + s for s in ("query", "gate", "key", "value")] + [q + "query", q + "key"]
        self.projections = backend.join_rows([weights[name] for name in inputs])
        self.index_query_norm = backend.array(weights[q + "query_norm"])
        self.index_key_norm = backend.array(weights[q + "key_norm"])

    @staticmethod
    def parameter_names(prefix: str) -> list[str]:
        q = prefix + "indexer/"
        indexer = [q + s for s in ("query", "key", "query_norm", "key_norm")]
        return GatedAttention.parameter_names(prefix) + indexer

    def __call__(  # type: ignore[override]
        self, x: Array, batch: Batch, memory: IndexedAttentionPages
    ) -> Array:
        be = self.backend
        n, width = x.shape[0], self.a.heads * self.a.head_dim
        q, gate, k, v, iq, ik = self.project(x, batch.cos, batch.sin)

        if batch.decode is not None:  # rows addressed by (slot, position): store all, then attend
            d = batch.decode
            self._op("write", memory)(memory.k, memory.v, d.page_table, d.slots, d.positions, k, v)
            pages_of = d.page_table[d.slots]
            per_page = memory.index_k.shape[1]
            at = (pages_of[be.xp.arange(n), d.positions // per_page], d.positions % per_page)
            memory.index_k[at] = ik
            memory.index_rope[at] = rope_halves(batch.cos, batch.sin)
            self._update_blocks(memory, pages_of, d.positions // self.indexer.compress_ratio)
            # the path (and past the budget the tokens read) from the step's variant, from the
            # positions the host knew; else from the positions read here
            if d.variant is not None:
                within = d.variant == ALL
            else:
                within = self.selects_all(max(d.host_positions))
            if within:
                scale = self.a.head_dim**-0.5
                o = self._op("decode", memory)(
                    q, memory.k, memory.v, d.page_table, d.slots, d.positions, scale=scale
                )
            else:  # the rows together, each over its own sequence, a block at a time
                if d.variant is not None:  # (SELECTED, bucket), at most the pages a slot has
                    length = min(d.variant[1], pages_of.shape[1] * per_page)
                else:
                    length = max(d.host_positions) + 1
                block = query_block(4 * length * self._token_floats(memory))

                def rows(r: slice) -> Array:
                    return self._attend(q[r], iq[r], pages_of[r], d.positions[r], length, memory)

                o = by_query_blocks(n, block, rows, be.xp)
        else:
            self._store_rows(batch, k, v, memory)
            o = batch.each_lane(lambda lane: self._lane(lane, batch, q, iq, ik, memory), be.xp)
        return be.linear(mul_sigmoid(o.reshape(n, width), gate), self.output)

    def selects_all(self, position: int) -> bool:
        """Whether the query at ``position`` (and so every earlier one) selects every token
        it sees (``selects_all``)."""
        return selects_all(self.indexer, position)

    def project(self, x: Array, cos: Array, sin: Array) -> tuple[Array, ...]:
        """The layer input [N, H] -> q [N, Nq, D] and k, v [N, Nkv, D] (normed, rotated),
        the output gate [N, Nq·D], the index queries [N, n, d] (normed, rotated) and the raw
        index keys [N, d]."""
        be, a, ix = self.backend, self.a, self.indexer
        n = x.shape[0]
        width, kv_width = a.heads * a.head_dim, a.kv_heads * a.head_dim
        ends = np.cumsum([width, width, kv_width, kv_width, ix.heads * ix.head_dim])
        q, gate, k, v, iq, ik = be.xp.split(be.linear(x, self.projections), ends, axis=-1)
        rms_norm = resolve("norm", "rms_norm", device=be.name)

        def normed_rotated(y: Array, heads: int, dim: int, norm: Array) -> Array:
            y = rms_norm(y.reshape(n, heads, dim), norm, self.eps, offset=1.0)
            return be.rope(y, cos, sin)

        q = normed_rotated(q, a.heads, a.head_dim, self.query_norm)
        k = normed_rotated(k, a.kv_heads, a.head_dim, self.key_norm)
        iq = normed_rotated(iq, ix.heads, ix.head_dim, self.index_query_norm)
        return q, gate, k, v.reshape(n, a.kv_heads, a.head_dim), iq, ik

    def _lane(
        self,
        lane: Any,
        batch: Batch,
        q: Array,
        iq: Array,
        ik: Array,
        memory: IndexedAttentionPages,
    ) -> Array:
        """A prefill lane's queries (its keys and values stored): its index keys stored,
        then over every token it sees, or the blocks its indexer selects."""
        r, ratio = lane.rows, self.indexer.compress_ratio
        memory.write_index(lane.state, lane.start, ik[r], batch.cos[r], batch.sin[r])
        last = lane.start + lane.tokens - 1
        touched = self.backend.xp.arange(lane.start // ratio, last // ratio + 1)
        self._update_blocks(memory, lane.state.page_ids, touched)
        if self.selects_all(last):
            return self._lane_prefill(lane, q, memory, self.a.head_dim**-0.5)
        length = lane.start + lane.tokens
        positions = np.arange(lane.start, length)
        return self._attend(q[r], iq[r], lane.state.page_ids, positions, length, memory)

    def _update_blocks(self, memory: IndexedAttentionPages, pages: Array, blocks: Array) -> None:
        """Makes again the keys of ``blocks`` from their tokens' raw keys and RoPE rows (after
        a write to them): blocks [K] of the sequence whose page-table row is ``pages``, or
        row i's block ``blocks[i]`` of its own sequence (``pages`` [N, pages])."""
        raw, halves = memory.block_records(pages, blocks)
        cos, sin = rope_rows(halves)
        ratio = self.indexer.compress_ratio
        keys = block_keys(raw, cos, sin, ratio, self.index_key_norm, self.eps, self.backend)
        memory.blocks.write(pages, blocks, keys[:, 0])

    def _attend(
        self,
        q: Array,
        iq: Array,
        pages: Array,
        positions: Array,
        length: int,
        memory: IndexedAttentionPages,
    ) -> Array:
        """Queries at ``positions`` of the sequence in ``pages`` (or of each query's own:
        ``pages`` [T, pages]) over the tokens the indexer selects for each, the blocks of the
        first ``length`` tokens scored; a block of queries at a time (``query_block``: their
        masks, scores and probabilities bounded at any context length). Where a query's
        choice is fewer tokens than ``length``, each attends over its chosen tokens'
        keys and values, gathered from the pages; else all attend over the first ``length``
        under their masks."""
        ix = self.indexer
        ratio = ix.compress_ratio
        keys = memory.blocks.read(pages, length)
        scale, own = self.a.head_dim**-0.5, pages.ndim == 2
        selected = (min(ix.block_topk, length // ratio) + 1) * ratio
        if pooled_keys.reads_chosen_tokens(selected, length):

            def attend(rows: slice) -> Array:
                mine = keys[rows] if own else keys
                ids, visible = chosen_tokens(iq[rows], mine, positions[rows], ix)
                where = pages[rows] if own else pages
                k = gather_kv_at(memory.k, where, ids)
                v = gather_kv_at(memory.v, where, ids)
                return masked_attention(q[rows], k, v, visible, scale)

            per_query = 4 * selected * (2 * self.a.heads + 2 * memory.k[0, 0].size)
        else:
            k, v = gather_kv(memory.k, pages, length), gather_kv(memory.v, pages, length)

            def attend(rows: slice) -> Array:
                mine = (lambda a: a[rows]) if own else (lambda a: a)
                visible = selection(iq[rows], mine(keys), positions[rows], length, ix)
                return masked_attention(q[rows], mine(k), mine(v), visible, scale)

            per_query = 4 * length * 2 * self.a.heads  # scores and probabilities
        return by_query_blocks(q.shape[0], query_block(per_query), attend, self.backend.xp)

    def _token_floats(self, memory: IndexedAttentionPages) -> int:
        """float32 values a row of a step reads per token of its sequence at most: its keys
        and values, its block's key (one a block), and its scores and their probabilities."""
        kv = 2 * self.a.kv_heads * self.a.head_dim
        return kv + memory.index_k.shape[-1] // self.indexer.compress_ratio + 2 * self.a.heads
