"""The DSA token indexer of GLM5Next attention layers: which cached tokens each query attends
to, chosen by whole pools of ``kpool`` tokens.

Each token leaves a record: its index key ``LayerNorm(key x)`` [d] and its pool-gate scores
``pool_gate x`` [d]. The complete pools of a sequence (tokens ``p·kpool .. p·kpool + kpool - 1``)
are summarised per channel by a softmax over the pool's tokens:

    pool_key_p = Σ_j softmax_j(gate_j + pool_position_j) ⊙ key_j

and a query scores them with its own heads (q_i = query · its query latent, w = head_weights x):

    score_p = Σ_i w_i / sqrt(n_i) · relu(q_i · pool_key_p / sqrt(d))

It keeps the ``topk / kpool`` best pools whose last token it may see (all of them while there
are no more), and always the open pool it is in (its tokens up to itself): attention then
runs over those tokens only. A layer marked ``shared`` reuses the choice of the layer before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ninfer_format.binders.glm5_next_parts import DsaIndexer

from ...arrays import array_module
from ...backends import Backend, Weight
from ..functional import top_k_mask

Array = Any
LAYER_NORM_EPS = 1e-6  # transformers' indexer key norm


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

    def select(self, queries: Array, weights: Array, records: Array, positions: Array) -> Array:
        """Which of a sequence's tokens each query sees: queries [T, n_i, d] and weights
        [T, n_i] of the queries at ``positions`` [T] (ints, either device), records [S, 2d] of its
        first S tokens -> visible [T, S] bool."""
        xp, kp = array_module(records), self.n.kpool
        s = records.shape[0]
        pools = s // kp  # complete pools; the open one is never scored
        positions = xp.asarray(positions)
        visible = xp.zeros((len(positions), s), dtype=bool)
        if pools:
            chosen = self._choose(queries, weights, records[: pools * kp], positions)
            visible[:, : pools * kp] = xp.repeat(chosen, kp, axis=1)
        tokens = xp.arange(s)[None, :]
        open_start = ((positions + 1) // kp * kp)[:, None]
        return visible | ((tokens >= open_start) & (tokens <= positions[:, None]))

    def _choose(self, queries: Array, weights: Array, records: Array, positions: Array) -> Array:
        """The pools [T, P] each query keeps: the best ``topk / kpool`` of those it sees."""
        xp = array_module(records)
        kp, d = self.n.kpool, self.n.head_dim
        pools = records.shape[0] // kp
        keys = records[:, :d].reshape(pools, kp, d)
        logits = records[:, d:].reshape(pools, kp, d) + self.pool_position
        share = xp.exp(logits - logits.max(axis=1, keepdims=True))
        share /= share.sum(axis=1, keepdims=True)  # softmax over each pool's tokens, per channel
        pool_keys = (share * keys).sum(axis=1)  # [P, d]
        scores = xp.maximum(queries @ pool_keys.T * xp.float32(d**-0.5), 0)  # [T, n_i, P]
        index = (weights[:, :, None] * scores).sum(axis=1)  # [T, P]
        seen = (xp.arange(pools) * kp + kp - 1)[None, :] <= positions[:, None]
        index = xp.where(seen, index, xp.float32(-xp.inf))
        return top_k_mask(index, self.n.pools_selected) & seen
