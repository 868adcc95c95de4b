"""Prefix reuse: checkpoints of earlier sequences, found again by their exact tokens.

A hybrid model can resume a prompt only where its recurrent state was kept, so the cache
holds **checkpoints** (``state.Checkpoint``): the GDN states copied into snapshot pages and
the K/V pages of the tokens before them, shared with whatever else holds those pages. The
engine keeps one at the end of every prompt and at the end of every finished generation
(the next chat turn resends it and continues after it). Long prompts are also kept every
``checkpoint_interval`` tokens (prefill chunks end there), so requests that share a long
system prompt and tools but differ after it resume from the last boundary before they
differ. A new request resumes from the deepest checkpoint whose tokens are exactly the first
tokens of its prompt and prefills only the rest; a prompt's own checkpoint keeps its last
logits, so the same prompt again starts generating at once.

Identity is token-exact. A checkpoint's key chains a hash over its tokens block by block
(``BLOCK_TOKENS`` at a time, each block's hash seeded by the one before, the first by the
cache's salt), then hashes the tokens after the last whole block; a lookup hashes the prompt
once and compares the tokens in full on a hit. The salt names what else decides a state and
is fixed for the engine that owns the cache (the artifact, the K/V storage type, the
backend), so keys never match across them.

When pages run short, checkpoints go by value: the prefill tokens a checkpoint saves per
page only it holds (its snapshot, and K/V pages nothing else holds), in powers of two, the
lowest first, and within a power of two the least recently used first.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import xxhash

from .state import Checkpoint, ContextPool

#: tokens per hashed block of a key's chain
BLOCK_TOKENS = 256


@dataclass(frozen=True)
class CacheBoundary:
    """A prompt position (a token count, ``0 < position < len(prompt)``) after which a
    request's prefill may keep a checkpoint, because other requests are likely to share the
    prompt up to there and differ after it. ``boundary``: one the server found in the
    prompt's structure (the end of the system message, of the tool definitions, of an
    earlier message); ``breakpoint``: one the client marked."""

    position: int
    kind: Literal["boundary", "breakpoint"] = "boundary"


@dataclass
class CacheStats:
    """Prompt tokens looked up, those found (resumed instead of prefilled), and
    checkpoints let go to make room."""

    queried_tokens: int = 0
    hit_tokens: int = 0
    evictions: int = 0


class _Chain:
    """The chained block hashes of one token sequence: ``key(n)`` is the key of its first
    ``n`` tokens."""

    def __init__(self, ids: np.ndarray, salt: bytes):
        self.ids = np.ascontiguousarray(ids, dtype=np.int64)
        self.blocks = [xxhash.xxh3_64_digest(salt)]
        for start in range(0, len(self.ids) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
            block = self.ids[start : start + BLOCK_TOKENS].tobytes()
            self.blocks.append(xxhash.xxh3_64_digest(block, seed=self._seed(-1)))

    def _seed(self, index: int) -> int:
        return int.from_bytes(self.blocks[index], "little")

    def key(self, length: int) -> tuple[int, int]:
        whole = length // BLOCK_TOKENS
        tail = self.ids[whole * BLOCK_TOKENS : length].tobytes()
        return length, xxhash.xxh3_64_intdigest(tail, seed=self._seed(whole))


class PrefixCache:
    """The checkpoints of one engine's pool, by their token ids."""

    def __init__(self, pool: ContextPool, salt: bytes = b""):
        self.pool = pool
        self.salt = salt
        # key -> (tokens, checkpoint), least recently used first
        self._entries: OrderedDict[tuple[int, int], tuple[np.ndarray, Checkpoint]] = OrderedDict()
        self.stats = CacheStats()

    def lookup(
        self, prompt: Sequence[int] | np.ndarray, *, whole: bool = False
    ) -> Checkpoint | None:
        """The deepest checkpoint whose tokens begin ``prompt`` (None: none): one that
        leaves some of it to prefill, or all of it when it kept its last logits (or when
        ``whole``: the caller needs no logits, as a preempted request that resumes)."""
        chain = _Chain(np.asarray(prompt, dtype=np.int64), self.salt)
        for length in sorted({n for n, _ in self._entries}, reverse=True):
            if length > len(chain.ids):
                continue
            key = chain.key(length)
            entry = self._entries.get(key)
            if entry is None:
                continue
            if length == len(chain.ids) and entry[1].logits is None and not whole:
                continue
            if np.array_equal(entry[0], chain.ids[:length]):
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
        key = _Chain(ids, self.salt).key(len(ids))
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
        key = _Chain(ids, self.salt).key(len(ids))
        if key in self._entries and np.array_equal(self._entries[key][0], ids):
            self._entries.move_to_end(key)
            self.pool.drop(checkpoint)
            return
        if key in self._entries:  # a hash collision: the newer one wins
            self.pool.drop(self._entries.pop(key)[1])
        self._entries[key] = (ids, checkpoint)

    def make_room(self, *, pages: int, keep: Checkpoint | None = None) -> bool:
        """Let checkpoints go, least valuable first (never ``keep``), until the pool has
        ``pages`` free pages; whether it has."""
        # first those whose going frees a page by itself, then (K/V pages several
        # checkpoints share) any, in the same order
        for selective in (True, False):
            while self.pool.free_pages < pages:
                holders = self.pool.holders()
                candidates = [
                    (self._value(checkpoint, own), age, key)
                    for age, (key, (_, checkpoint)) in enumerate(self._entries.items())
                    if checkpoint is not keep
                    and ((own := self._own_pages(checkpoint, holders)) or not selective)
                ]
                if not candidates:
                    break
                _, _, key = min(candidates)
                self.pool.drop(self._entries.pop(key)[1])
                self.stats.evictions += 1
        return self.pool.free_pages >= pages

    @staticmethod
    def _own_pages(checkpoint: Checkpoint, holders: np.ndarray) -> int:
        """Pages that go back to the pool with ``checkpoint``: its snapshot, and K/V pages
        nothing else holds."""
        return len(checkpoint.snapshot) + int((holders[list(checkpoint.pages)] == 1).sum())

    @staticmethod
    def _value(checkpoint: Checkpoint, own_pages: int) -> int:
        """Prefill tokens saved per page freed, as a power of two (ties: age decides)."""
        return int(math.log2(max(checkpoint.length / max(own_pages, 1), 1)))

    def checkpoints(self) -> list[Checkpoint]:
        return [checkpoint for _, checkpoint in self._entries.values()]

    def clear(self) -> None:
        for _, checkpoint in self._entries.values():
            self.pool.drop(checkpoint)
        self._entries.clear()
