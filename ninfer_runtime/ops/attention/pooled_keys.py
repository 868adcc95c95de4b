"""Keys kept one a pool of consecutive tokens, in pages beside the tokens': what a token indexer
scores (GLM5Next's pools, Qwen4Exp's compressed blocks) instead of every token's record.

Pool p of a sequence holds its tokens ``p·pool_tokens .. p·pool_tokens + pool_tokens - 1``;
its key is kept in the page of its first token, at ``(p · pool_tokens % page_tokens) //
pool_tokens`` (distinct for the pools starting in a page, whatever the page size). The layer
makes a pool's key again from its tokens' records whenever one of them is written, so a pool's
key is right once the pool is complete (its last token's write made it from every record).
Until then it may hold anything (a partial pool's, a copied page's), and nothing reads it: an
indexer scores complete pools only.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...arrays import array_module

Array = Any


def reads_chosen_tokens(selected: int, tokens: int) -> bool:
    """Whether queries attend over the ``selected`` tokens each chose (``chosen_tokens``),
    gathered, rather than over all ``tokens`` they may see under a mask: when they are fewer
    (a long context's)."""
    return selected < tokens


def chosen_tokens(
    kept: Array, seen: Array, positions: Array, pool_tokens: int
) -> tuple[Array, Array]:
    """The tokens queries at ``positions`` [T] attend to, from the pools each kept [T, k]
    (``seen`` [T, k]: which of them it sees) and its open pool (the tokens after its last
    complete pool, up to itself) -> token ids int [T, (k + 1) · pool_tokens] and bool visible
    alike; a token not visible names token 0 (a row any sequence has)."""
    xp, t = array_module(positions), positions.shape[0]
    offsets = xp.arange(pool_tokens)
    ids = (kept[:, :, None] * pool_tokens + offsets).reshape(t, -1)
    open_pool = ((positions + 1) // pool_tokens * pool_tokens)[:, None] + offsets
    ids = xp.concatenate([ids, open_pool], axis=1)
    visible = xp.concatenate(
        [xp.repeat(seen, pool_tokens, axis=1), open_pool <= positions[:, None]], axis=1
    )
    return xp.where(visible, ids, 0), visible


def pools_a_page(page_tokens: int, pool_tokens: int) -> int:
    """Pool keys a page keeps: one for each pool whose first token is in it."""
    return -(-page_tokens // pool_tokens)


class PooledKeys:
    """``keys [pages, pools_a_page, width]`` float32 of pools of ``pool_tokens`` tokens."""

    def __init__(self, pages: int, page_tokens: int, pool_tokens: int, width: int, xp: ModuleType):
        self.page_tokens, self.pool_tokens = page_tokens, pool_tokens
        per_page = pools_a_page(page_tokens, pool_tokens)
        self.keys = xp.zeros((pages, per_page, width), xp.float32)

    def tokens_of(self, page_ids: Array, pools: Array) -> tuple[Array, Array]:
        """(page, row) [K, pool_tokens] of the tokens of pools ``pools`` [K] of one sequence
        (``page_ids`` [pages]), or of row i's pool ``pools[i]`` of its own sequence
        (``page_ids`` [N, pages], pools [N]); a pool's tokens past the last page read the last
        page's rows (never part of a complete pool)."""
        xp, p = array_module(self.keys), self.page_tokens
        tokens = pools[:, None] * self.pool_tokens + xp.arange(self.pool_tokens)
        which = xp.minimum(tokens // p, page_ids.shape[-1] - 1)
        if page_ids.ndim == 2:
            return page_ids[xp.arange(pools.shape[0])[:, None], which], tokens % p
        return page_ids[which], tokens % p

    def write(self, page_ids: Array, pools: Array, keys: Array) -> None:
        """Keys [K, width] of ``pools``, addressed as ``tokens_of`` addresses their tokens."""
        page, slot = self._addresses(page_ids, pools, per_row=page_ids.ndim == 2)
        self.keys[page, slot] = keys

    def read(self, page_ids: Array, length: int) -> Array:
        """The keys of the pools tokens ``0 .. length - 1`` complete [length // pool_tokens,
        width]: of one sequence (``page_ids`` [pages]) or of each of N ([N, pages] -> [N,
        pools, width])."""
        pools = array_module(self.keys).arange(length // self.pool_tokens)
        page, slot = self._addresses(page_ids, pools)
        return self.keys[page, slot]

    def copy(self, src: int, dst: int) -> None:
        """Every key of page ``src`` into page ``dst`` (a key of a pool the copy leaves
        incomplete is made again by the write that completes it)."""
        self.keys[dst] = self.keys[src]

    def _addresses(
        self, page_ids: Array, pools: Array, per_row: bool = False
    ) -> tuple[Array, Array]:
        """(page, slot) of each pool's key: pools [K] of every sequence of ``page_ids``
        ([pages] or [N, pages] -> [K] or [N, K]); ``per_row``: ``page_ids`` [N, pages] and
        pools [N], row i's pool of its own sequence ([N])."""
        xp, p = array_module(self.keys), self.page_tokens
        first = pools * self.pool_tokens
        slot = (first % p) // self.pool_tokens
        if per_row:
            return page_ids[xp.arange(pools.shape[0]), first // p], slot
        return page_ids[..., first // p], slot
