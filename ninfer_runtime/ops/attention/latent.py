"""The memory kind of multi-head latent attention (MLA) layers: each token's compressed latent
in pages, instead of per-head keys and values.

A latent-attention layer keeps, per token, the normalised latent its keys and values expand
from (``latent_dim`` = kv_rank + the rotated key part, 0 wide for a NoPE model) in the pool's
K/V storage dtype, and, when the layer runs its own token indexer, the indexer's record of the
token (``index_dim`` key channels and as many pool-gate channels, float32: the top-k choice
reads them, so they are kept as computed) and, per pool of ``pool_tokens`` tokens, the pool's
key (``index_dim`` channels, float32, ``pooled_keys.py``) that the indexer makes from its
tokens' records whenever one of them is written: a choice reads those keys, one a pool, not
every token's record. Token t of a sequence is row ``t % page_tokens`` of its page
``t // page_tokens``, as in ``memory.py``. Nothing is kept per slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ...arrays import array_module
from ...kv_storage import gather_kv_at, kv_storage_dtype, kv_value_bytes, load_kv, store_kv
from ...memory_kinds import PagedKind
from .pooled_keys import PooledKeys, pools_a_page

Array = Any


class LatentPages:
    """One latent-attention layer's pages: ``latent [pages, P, latent_dim]`` (K/V storage
    dtype), ``index [pages, P, 2 * index_dim]`` float32 (0 wide without an indexer) and, with
    an indexer, ``pools``: its pools' keys."""

    def __init__(
        self, spec: LatentSpec, pages: int, page_tokens: int, xp: ModuleType, kv_dtype: str
    ):
        self.latent = xp.zeros((pages, page_tokens, spec.latent_dim), kv_storage_dtype(kv_dtype))
        self.index = xp.zeros((pages, page_tokens, 2 * spec.index_dim), xp.float32)
        self.pools: PooledKeys | None = None
        if spec.index_dim:
            self.pools = PooledKeys(pages, page_tokens, spec.pool_tokens, spec.index_dim, xp)

    def write(self, page_ids: Array, start: int, latent: Array, index: Array | None) -> None:
        """Tokens ``start .. start + len(latent) - 1`` of the sequence whose pages are
        ``page_ids`` (its row of the page table)."""
        page, row = self._addresses(page_ids, start, latent.shape[0])
        self.latent[page, row] = store_kv(latent, self.latent.dtype)
        if index is not None:
            self.index[page, row] = index

    def read(self, page_ids: Array, length: int) -> Array:
        """The latents of tokens ``0 .. length - 1`` [length, latent_dim] as float32.
        ``page_ids`` [pages] is one sequence's row of the page table, or [N, pages] those of
        N sequences: then [N, length, latent_dim] (rows past a sequence's own length hold
        whatever its pages do)."""
        page, row = self._addresses(page_ids, 0, length)
        return load_kv(self.latent[page, row])

    def read_at(self, page_ids: Array, tokens: Array) -> Array:
        """The latents of row i's tokens ``tokens[i]`` [N, J] of its own sequence
        (``page_ids`` [N, pages]) -> [N, J, latent_dim] float32."""
        return gather_kv_at(self.latent, page_ids, tokens)

    def pool_records(self, page_ids: Array, pools: Array) -> Array:
        """The indexer records [K, pool_tokens, 2 * index_dim] of ``pools`` (as
        ``PooledKeys.tokens_of`` addresses them), which their keys are made from."""
        assert self.pools is not None
        return self.index[self.pools.tokens_of(page_ids, pools)]

    def write_rows(
        self, page_ids: Array, positions: Array, latent: Array, index: Array | None
    ) -> None:
        """Row i's token at ``positions[i]`` of the sequence whose pages are ``page_ids[i]``
        (a step's rows, each of its own sequence)."""
        xp = array_module(self.latent)
        p = self.latent.shape[1]
        page = page_ids[xp.arange(page_ids.shape[0]), positions // p]
        row = positions % p
        self.latent[page, row] = store_kv(latent, self.latent.dtype)
        if index is not None:
            self.index[page, row] = index

    def _addresses(self, page_ids: Array, start: int, count: int) -> tuple[Array, Array]:
        p = self.latent.shape[1]
        positions = array_module(self.latent).arange(start, start + count)
        return page_ids[..., positions // p], positions % p

    # ------------------------------------------------------------ the pool's interface
    def page_parts(self) -> Sequence[Array]:
        return (self.latent, self.index, *(() if self.pools is None else (self.pools.keys,)))

    def slot_parts(self) -> Sequence[Array]:
        return ()

    def reset(self, slot: int) -> None:
        """Nothing to clear: rows past a sequence's length are overwritten, never read."""

    def copy_tokens(self, src: int, dst: int, tokens: int) -> None:
        """The first ``tokens`` rows, and every pool key of the page."""
        self.latent[dst, :tokens] = self.latent[src, :tokens]
        self.index[dst, :tokens] = self.index[src, :tokens]
        if self.pools is not None:
            self.pools.copy(src, dst)


@dataclass(frozen=True)
class LatentSpec(PagedKind):
    """A latent-attention layer: ``latent_dim`` values a token, plus ``2 * index_dim``
    float32 values a token and ``index_dim`` a pool of ``pool_tokens`` when it runs an
    indexer (``index_dim`` 0: it reuses another layer's choice)."""

    pages = LatentPages

    latent_dim: int
    index_dim: int = 0
    pool_tokens: int = 0

    def __post_init__(self) -> None:
        if self.index_dim and self.pool_tokens < 1:
            raise ValueError(f"a latent layer with an indexer needs pool_tokens >= 1, not {self}")

    def page_bytes(self, page_tokens: int, kv_dtype: str) -> int:
        latent = self.latent_dim * kv_value_bytes(kv_dtype)
        pools = pools_a_page(page_tokens, self.pool_tokens) if self.index_dim else 0
        return page_tokens * (latent + 4 * 2 * self.index_dim) + 4 * self.index_dim * pools
