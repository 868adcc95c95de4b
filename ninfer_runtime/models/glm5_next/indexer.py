"""The DSA token indexer of GLM5Next attention layers: which cached tokens each query attends
to, chosen by whole pools of ``kpool`` tokens.

Each token leaves a record: its index key ``LayerNorm(key x)`` [d] and its pool-gate scores
``pool_gate x`` [d]. The pools of a sequence (tokens ``p·kpool .. p·kpool + kpool - 1``) are
summarised per channel by a softmax over the pool's tokens:

    pool_key_p = Σ_j softmax_j(gate_j + pool_position_j) ⊙ key_j

made whenever a token of the pool is written (``update_pools``) and kept in the layer's pages
(``LatentPages.pools``), so a choice reads one key a pool instead of every token's record.

and a query scores them with its own heads (q_i = query · its query latent, w = head_weights x):

    score_p = Σ_i w_i / sqrt(n_i) · relu(q_i · pool_key_p / sqrt(d))

It keeps the ``topk / kpool`` best pools whose last token it may see (all of them while there
are no more), and always the open pool it is in (its tokens up to itself): attention then
runs over those tokens only. A layer marked ``shared`` reuses the choice of the layer before.

The choice is kept as each query's pool numbers (``PoolChoice``: ``topk / kpool`` of them),
not as a mask over the context, and queries are scored a block at a time: what a prefill
chunk holds stays bounded at any context length (``functional.query_block``; a mask is made
for one block of queries when attention reads it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ninfer_format.binders.glm5_next_parts import DsaIndexer

from ...arrays import array_module
from ...backends import Backend, Weight
from ...functional import by_query_blocks, query_block, top_k_ids
from ...ops.attention.latent import LatentPages
from ...ops.attention.pooled_keys import chosen_tokens
from ...ops.linear import matmul

Array = Any
LAYER_NORM_EPS = 1e-6  # transformers' indexer key norm


@dataclass(frozen=True)
class PoolChoice:
    """The pools the queries at ``positions`` [T] keep: ``pools`` int [T, k] (pool p holds
    tokens ``p·kpool .. p·kpool + kpool - 1``; -1 where a query sees fewer than k)."""

    pools: Array
    positions: Array
    kpool: int

    @property
    def selected(self) -> int:
        """Tokens a query may see at most: its kept pools' and the open pool's."""
        return (self.pools.shape[1] + 1) * self.kpool

    def chosen_tokens(self, rows: slice) -> tuple[Array, Array]:
        """(token ids int [len(rows), selected], bool visible alike): each query's kept
        pools' tokens, then its open pool's (``pooled_keys.chosen_tokens``; a pool not kept
        is -1)."""
        pools = self.pools[rows]
        return chosen_tokens(pools, pools >= 0, self.positions[rows], self.kpool)

    def visible(self, rows: slice, tokens: int) -> Array:
        """bool [len(rows), tokens]: which of the first ``tokens`` tokens the queries
        ``rows`` see: their kept pools' tokens, and the open pool up to each query."""
        xp, kp = array_module(self.positions), self.kpool
        pools, positions = self.pools[rows], self.positions[rows]
        t = positions.shape[0]
        # column ``tokens`` takes the pools not kept (-1): no mask is indexed by a mask,
        # which would read its count on the host
        seen = xp.zeros((t, tokens + 1), dtype=bool)
        if pools.shape[1]:
            columns = xp.minimum(pools[:, :, None] * kp + xp.arange(kp), tokens)  # [t, k, kp]
            columns = xp.where(pools[:, :, None] >= 0, columns, tokens)
            seen[xp.arange(t)[:, None, None], columns] = True
        seen = seen[:, :tokens]
        token = xp.arange(tokens)[None, :]
        open_start = ((positions + 1) // kp * kp)[:, None]
        return seen | ((token >= open_start) & (token <= positions[:, None]))


class TokenIndexer:
    def __init__(self, prefix: str, n: DsaIndexer, backend: Backend, weights: Mapping[str, Weight]):
        p = prefix + "indexer/"
        self.n, self.backend = n, backend
        # the three projections of the layer input as one product: [key | pool_gate | heads]
        inputs = ("key", "pool_gate", "head_weights")
        self.inputs = backend.join_rows([weights[p + s] for s in inputs])
        self.query = weights[p + "query"]
        self.key_norm = backend.array(weights[p + "key_norm"])
        self.key_norm_bias = backend.array(weights[p + "key_norm_bias"])
        self.pool_position = backend.array(weights[p + "pool_position"])  # [kpool, d]

    @staticmethod
    def parameter_names(prefix: str) -> list[str]:
        parts = ("query", "key", "key_norm", "key_norm_bias", "head_weights", "pool_gate")
        return [f"{prefix}indexer/{s}" for s in (*parts, "pool_position")]

    def project(self, x: Array, query_latent: Array) -> tuple[Array, Array, Array]:
        """Rows x [N, H] and their query latents -> each token's record [N, 2d] (index key |
        pool-gate scores), its query heads [N, n_i, d] and their weights [N, n_i]."""
        be, n, d = self.backend, self.n, self.n.head_dim
        xp = array_module(x)
        projected = be.linear(x, self.inputs)
        key, gate, heads = projected[:, :d], projected[:, d : 2 * d], projected[:, 2 * d :]
        centred = key - key.mean(axis=-1, keepdims=True)
        var = (centred * centred).mean(axis=-1, keepdims=True)
        key = centred / xp.sqrt(var + LAYER_NORM_EPS) * self.key_norm + self.key_norm_bias
        queries = be.linear(query_latent, self.query).reshape(-1, n.heads, d)
        return xp.concatenate([key, gate], axis=-1), queries, heads * n.heads**-0.5

    def update_pools(self, memory: LatentPages, page_ids: Array, pools: Array) -> None:
        """Makes again the keys of ``pools`` from their records in ``memory`` (after a write
        to them): pools [K] of the sequence whose page-table row is ``page_ids``, or row i's
        pool ``pools[i]`` of its own sequence (``page_ids`` [N, pages])."""
        assert memory.pools is not None
        memory.pools.write(page_ids, pools, self._pool_keys(memory.pool_records(page_ids, pools)))

    def choose(self, queries: Array, weights: Array, keys: Array, positions: Array) -> PoolChoice:
        """The pools each query keeps: queries [T, n_i, d] and weights [T, n_i] of the
        queries at ``positions`` [T] (ints, either device) over the keys [P, d] of their
        sequence's first P pools, or [T, P, d]: each query's own sequence (a step's lanes;
        the pools past a sequence's length are never chosen); ``query_block`` queries at a
        time."""
        xp, kp = array_module(keys), self.n.kpool
        positions = xp.asarray(positions)
        pools = keys.shape[-2]  # the open pool among them is never chosen
        k = min(self.n.pools_selected, pools)
        if not k:
            return PoolChoice(xp.full((positions.shape[0], 0), -1, xp.int64), positions, kp)
        own = keys.ndim == 3
        per_query = self.n.heads * pools + (pools * keys.shape[-1] if own else 0)

        def best(rows: slice) -> Array:
            mine = keys[rows] if own else keys
            return self._best(queries[rows], weights[rows], mine, positions[rows], k)

        chosen = by_query_blocks(positions.shape[0], query_block(4 * per_query), best, xp)
        return PoolChoice(chosen, positions, kp)

    def _pool_keys(self, records: Array) -> Array:
        """Pool keys [..., d] of their tokens' records [..., kpool, 2d]: the tokens' keys
        mixed by a softmax over the pool's tokens, per channel, of their gate scores and the
        pool positions'."""
        xp, d = array_module(records), self.n.head_dim
        logits = records[..., d:] + self.pool_position
        share = xp.exp(logits - logits.max(axis=-2, keepdims=True))
        share /= share.sum(axis=-2, keepdims=True)
        return (share * records[..., :d]).sum(axis=-2)

    def _best(self, queries: Array, weights: Array, keys: Array, positions: Array, k: int) -> Array:
        """int [T, k]: the k best pools each query sees (by score, ties: the earlier pool),
        -1 past those it sees; ``keys`` [P, d], or [T, P, d] each query's own."""
        xp, kp, d = array_module(keys), self.n.kpool, self.n.head_dim
        pools = keys.shape[-2]
        scores = matmul(queries, keys.swapaxes(-1, -2))  # [T, n_i, P]
        scores = xp.maximum(scores * xp.float32(d**-0.5), 0)
        index = (weights[:, :, None] * scores).sum(axis=1)  # [T, P]
        seen = (xp.arange(pools) * kp + kp - 1)[None, :] <= positions[:, None]
        best = top_k_ids(xp.where(seen, index, xp.float32(-xp.inf)), k)
        return xp.where(xp.take_along_axis(seen, best, axis=1), best, -1)
