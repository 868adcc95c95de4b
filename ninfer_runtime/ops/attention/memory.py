"""The memory kind of full-attention layers: keys and values in pages.

Each layer keeps ``k`` and ``v`` of ``[pages, page_tokens, Nkv, D]``, in the storage dtype of
the pool's ``kv_dtype`` (``kv_storage``); token t of a sequence is row ``t % page_tokens`` of
its page ``t // page_tokens``. Nothing is kept per slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ...kv_storage import kv_storage_dtype, kv_value_bytes
from ...memory_kinds import PagedKind

Array = Any


class AttentionPages:
    """One attention layer's keys and values, ``[pages, page_tokens, Nkv, D]`` each, in the
    storage dtype of ``kv_dtype`` (``kv_storage.KV_DTYPES``)."""

    def __init__(self, spec: KvSpec, pages: int, page_tokens: int, xp: ModuleType, kv_dtype: str):
        shape = (pages, page_tokens, spec.kv_heads, spec.head_dim)
        dtype = kv_storage_dtype(kv_dtype)
        self.k = xp.zeros(shape, dtype)
        self.v = xp.zeros(shape, dtype)

    # ------------------------------------------------------------ the pool's interface
    def page_parts(self) -> Sequence[Array]:
        return (self.k, self.v)

    def slot_parts(self) -> Sequence[Array]:
        return ()

    def reset(self, slot: int) -> None:
        """Nothing to clear: rows past a sequence's length are overwritten, never read."""

    def copy_tokens(self, src: int, dst: int, tokens: int) -> None:
        self.k[dst, :tokens] = self.k[src, :tokens]
        self.v[dst, :tokens] = self.v[src, :tokens]


@dataclass(frozen=True)
class KvSpec(PagedKind):
    """A full-attention layer: keys and values per token, after k_norm and RoPE."""

    pages = AttentionPages

    kv_heads: int
    head_dim: int

    def page_bytes(self, page_tokens: int, kv_dtype: str) -> int:
        return 2 * page_tokens * self.kv_heads * self.head_dim * kv_value_bytes(kv_dtype)
