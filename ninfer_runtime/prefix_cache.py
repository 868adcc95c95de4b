"""Prefix reuse: checkpoints of earlier sequences, found again by their exact tokens.

A hybrid model can resume a prompt only where its recurrent state was kept, so the cache
holds **checkpoints** (``state.Checkpoint``): the GDN states copied into a snapshot slot and
the K/V pages of the tokens before them, shared with whatever else holds those pages. The
engine keeps one at the end of every prompt and at the end of every finished generation
(the next chat turn resends it and continues after it). Long prompts are also kept every
``checkpoint_interval`` tokens (prefill chunks end there), so requests that share a long
system prompt and tools but differ after it resume from the last boundary before they
differ. A new request resumes
from the deepest checkpoint whose tokens are exactly the first tokens of its prompt and
prefills only the rest; a prompt's own checkpoint keeps its last logits, so the same prompt
again starts generating at once.

Identity is token-exact: the key is the token ids themselves (hashed for the lookup and
compared in full on a hit). Everything else that changes a state (the artifact, the K/V
storage type, the backend) is fixed for the engine that owns the cache, so it needs no salt.
Entries go least recently used first when the pool needs their pages or snapshot slots.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .state import Checkpoint, ContextPool


@dataclass
class CacheStats:
    """Prompt tokens looked up, and those found (resumed instead of prefilled)."""

    queried_tokens: int = 0
    hit_tokens: int = 0
    evictions: int = 0


class PrefixCache:
    """The checkpoints of one engine's pool, by their token ids."""

    def __init__(self, pool: ContextPool):
        self.pool = pool
        self._entries: OrderedDict[tuple[int, int], tuple[np.ndarray, Checkpoint]] = OrderedDict()
        self.stats = CacheStats()

    @staticmethod
    def _key(ids: np.ndarray) -> tuple[int, int]:
        return len(ids), hash(np.ascontiguousarray(ids, dtype=np.int64).tobytes())

    def lookup(
        self, prompt: Sequence[int] | np.ndarray, *, whole: bool = False
    ) -> Checkpoint | None:
        """The deepest checkpoint whose tokens begin ``prompt`` (None: none): one that
        leaves some of it to prefill, or all of it when it kept its last logits (or when
        ``whole``: the caller needs no logits, as a preempted request that resumes)."""
        ids = np.asarray(prompt, dtype=np.int64)
        for length in sorted({n for n, _ in self._entries}, reverse=True):
            if length > len(ids):
                continue
            key = self._key(ids[:length])
            entry = self._entries.get(key)
            if entry is None or (length == len(ids) and entry[1].logits is None and not whole):
                continue
            if np.array_equal(entry[0], ids[:length]):
                self._entries.move_to_end(key)
                return entry[1]
        return None

    def count(self, prompt_tokens: int, hit: Checkpoint | None) -> None:
        """Record one admitted request's lookup."""
        self.stats.queried_tokens += prompt_tokens
        self.stats.hit_tokens += hit.length if hit is not None else 0

    def refresh(self, tokens: Sequence[int] | np.ndarray) -> bool:
        """Whether a checkpoint of exactly ``tokens`` is kept (it becomes the most recently
        used): then there is no need to keep another."""
        ids = np.asarray(tokens, dtype=np.int64)
        key = self._key(ids)
        entry = self._entries.get(key)
        if entry is None or not np.array_equal(entry[0], ids):
            return False
        self._entries.move_to_end(key)
        return True

    def insert(self, tokens: Sequence[int] | np.ndarray, checkpoint: Checkpoint) -> None:
        """Keep ``checkpoint`` of the sequence that consumed ``tokens`` (one already kept
        for the same tokens is refreshed, and the new one let go)."""
        ids = np.array(tokens, dtype=np.int64)
        if len(ids) != checkpoint.length:
            raise ValueError(f"{len(ids)} tokens for a checkpoint of {checkpoint.length}")
        key = self._key(ids)
        if key in self._entries and np.array_equal(self._entries[key][0], ids):
            self._entries.move_to_end(key)
            self.pool.drop(checkpoint)
            return
        if key in self._entries:  # a hash collision: the newer one wins
            self.pool.drop(self._entries.pop(key)[1])
        self._entries[key] = (ids, checkpoint)

    def make_room(
        self, *, pages: int = 0, snapshots: int = 0, keep: Checkpoint | None = None
    ) -> bool:
        """Let checkpoints go, least recently used first (never ``keep``), until the pool
        has ``pages`` free pages and ``snapshots`` free snapshot slots; whether it has."""

        def enough() -> bool:
            pool = self.pool
            return pool.free_pages >= pages and pool.free_snapshots >= snapshots

        # first the checkpoints whose going frees what is short by itself, then (pages
        # several checkpoints share) any, least recently used first
        for selective in (True, False):
            for key in list(self._entries):
                if enough():
                    break
                checkpoint = self._entries[key][1]
                if checkpoint is keep:
                    continue
                if selective and not self._would_help(checkpoint, pages, snapshots):
                    continue
                del self._entries[key]
                self.pool.drop(checkpoint)
                self.stats.evictions += 1
        return enough()

    def _would_help(self, checkpoint: Checkpoint, pages: int, snapshots: int) -> bool:
        """Whether letting ``checkpoint`` go frees what is short: a snapshot slot, or a
        page no one else holds (a page a running sequence shares stays in use)."""
        if self.pool.free_snapshots < snapshots:
            return True
        holders = self.pool.holders()
        return self.pool.free_pages < pages and any(holders[p] == 1 for p in checkpoint.pages)

    def checkpoints(self) -> list[Checkpoint]:
        return [checkpoint for _, checkpoint in self._entries.values()]

    def clear(self) -> None:
        for _, checkpoint in self._entries.values():
            self.pool.drop(checkpoint)
        self._entries.clear()
