"""The memory kind of multi-head latent attention (MLA) layers: each token's compressed latent
in pages, instead of per-head keys and values.

A latent-attention layer keeps, per token, the normalised latent its keys and values expand
from (``latent_dim`` = kv_rank + the rotated key part, 0 wide for a NoPE model) in the pool's
K/V storage dtype, and, when the layer runs its own token indexer, the indexer's record of the
token (``index_dim`` key channels and as many pool-gate channels, float32: the top-k choice
reads them, so they are kept as computed). Token t of a sequence is row ``t % page_tokens`` of
its page ``t // page_tokens``, as in ``memory.py``. Nothing is kept per slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ...arrays import array_module
from ...kv_storage import kv_storage_dtype, kv_value_bytes, load_kv, store_kv
from ...memory_kinds import PagedKind

Array = Any


class LatentPages:
    """One latent-attention layer's pages: ``latent [pages, P, latent_dim]`` (K/V storage
    dtype) and ``index [pages, P, 2 * index_dim]`` float32 (0 wide without an indexer)."""

    def __init__(
        self, spec: LatentSpec, pages: int, page_tokens: int, xp: ModuleType, kv_dtype: str
    ):
        self.latent = xp.zeros((pages, page_tokens, spec.latent_dim), kv_storage_dtype(kv_dtype))
        self.index = xp.zeros((pages, page_tokens, 2 * spec.index_dim), xp.float32)

    def write(self, page_ids: Array, start: int, latent: Array, index: Array | None) -> None:
        """Tokens ``start .. start + len(latent) - 1`` of the sequence whose pages are
        ``page_ids`` (its row of the page table)."""
        page, row = self._addresses(page_ids, start, latent.shape[0])
        self.latent[page, row] = store_kv(latent, self.latent.dtype)
        if index is not None:
            self.index[page, row] = index

    def read(self, page_ids: Array, length: int) -> tuple[Array, Array]:
        """Tokens ``0 .. length - 1``: the latents [length, latent_dim] as float32 and the
        indexer records [length, 2 * index_dim]. ``page_ids`` [pages] is one sequence's row
        of the page table, or [N, pages] those of N sequences: then [N, length, ...] each
        (rows past a sequence's own length hold whatever its pages do)."""
        page, row = self._addresses(page_ids, 0, length)
        return load_kv(self.latent[page, row]), self.index[page, row]

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
        return (self.latent, self.index)

    def slot_parts(self) -> Sequence[Array]:
        return ()

    def reset(self, slot: int) -> None:
        """Nothing to clear: rows past a sequence's length are overwritten, never read."""

    def copy_tokens(self, src: int, dst: int, tokens: int) -> None:
        self.latent[dst, :tokens] = self.latent[src, :tokens]
        self.index[dst, :tokens] = self.index[src, :tokens]


@dataclass(frozen=True)
class LatentSpec(PagedKind):
    """A latent-attention layer: ``latent_dim`` values a token, plus ``2 * index_dim``
    float32 values when it runs an indexer (0: it reuses another layer's choice)."""

    pages = LatentPages

    latent_dim: int
    index_dim: int = 0

    def page_bytes(self, page_tokens: int, kv_dtype: str) -> int:
        latent = self.latent_dim * kv_value_bytes(kv_dtype)
        return page_tokens * (latent + 4 * 2 * self.index_dim)
