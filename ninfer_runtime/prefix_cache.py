"""Prefix reuse: checkpoints of earlier sequences, found again by their exact tokens.

A hybrid model can resume a prompt only where its recurrent state was kept, so the cache
holds **checkpoints** (``snapshots.Checkpoint``): the GDN states copied into snapshot pages and
the K/V pages of the tokens before them, shared with whatever else holds those pages. The
engine keeps one at the end of every prompt and at the end of every finished generation
(the next chat turn resends it and continues after it). Long prompts are also kept every
``checkpoint_interval`` tokens (prefill chunks end there), so requests that share a long
system prompt and tools but differ after it resume from the last boundary before they
differ. A request may also name positions of its own (``CacheBoundary``: where its system
message or tools end, where a client marked a breakpoint): the engine keeps a few of them
(``checkpoint_plan``). A new request resumes from the deepest checkpoint whose tokens are
exactly the first tokens of its prompt and prefills only the rest; a prompt's own checkpoint
keeps its last logits, so the same prompt again starts generating at once.

Identity is token-exact. A checkpoint's key chains a hash over its tokens block by block
(``BLOCK_TOKENS`` at a time, each block's hash seeded by the one before, the first by the
cache's salt), then hashes the tokens after the last whole block; a lookup hashes the prompt
once and compares the tokens in full on a hit. The salt names what else decides a state and
is fixed for the engine that owns the cache (the artifact, the K/V storage type, the
backend), so keys never match across them; each request adds its own ``cache_salt`` to it
(None is a namespace of its own), so requests of different salts never share an entry.

When pages run short, checkpoints go by value: the prefill tokens a checkpoint saves per
page only it holds (its snapshot, and K/V pages nothing else holds), in powers of two, the
lowest first, and within a power of two the least recently used first.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import xxhash

from .state import Checkpoint, ContextPool

#: tokens per hashed block of a key's chain
BLOCK_TOKENS = 256
#: why a checkpoint was kept: the end of a prompt, a boundary the server found in it, a
#: breakpoint its client marked, every ``checkpoint_interval`` tokens of a prefill, the end
#: of a generation
CHECKPOINT_KINDS = ("prompt_end", "boundary", "breakpoint", "interval", "generation")


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
        self.namespace = salt
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


class _Entry(NamedTuple):
    tokens: np.ndarray
    namespace: bytes
    checkpoint: Checkpoint


class PrefixCache:
    """The checkpoints of one engine's pool, by their token ids and their requests' salt."""

    def __init__(self, pool: ContextPool, salt: bytes = b""):
        self.pool = pool
        self.salt = salt
        # key -> entry, least recently used first
        self._entries: OrderedDict[tuple[int, int], _Entry] = OrderedDict()
        self.stats = CacheStats()

    def _namespace(self, salt: str | None) -> bytes:
        """The engine's salt and a request's: unsalted requests share one namespace, and
        no salt string can name it (the marker byte differs)."""
        return self.salt + (b"\x00" if salt is None else b"\x01" + salt.encode("utf-8"))

    def _chain(self, tokens: Sequence[int] | np.ndarray, salt: str | None) -> _Chain:
        return _Chain(np.asarray(tokens, dtype=np.int64), self._namespace(salt))

    def _match(self, chain: _Chain, length: int) -> _Entry | None:
        """The entry of exactly the first ``length`` tokens of ``chain``, in its namespace."""
        entry = self._entries.get(chain.key(length))
        if entry is None or entry.namespace != chain.namespace:
            return None
        return entry if np.array_equal(entry.tokens, chain.ids[:length]) else None

    def lookup(
        self, prompt: Sequence[int] | np.ndarray, *, whole: bool = False, salt: str | None = None
    ) -> Checkpoint | None:
        """The deepest checkpoint kept under ``salt`` whose tokens begin ``prompt`` (None:
        none): one that leaves some of it to prefill, or all of it when it kept its last
        logits (or when ``whole``: the caller needs no logits, as a preempted request that
        resumes). It becomes the most recently used."""
        chain = self._chain(prompt, salt)
        entry = self._deepest(chain, whole)
        if entry is None:
            return None
        self._entries.move_to_end(chain.key(entry.checkpoint.length))
        return entry.checkpoint

    def resumable(self, prompt: Sequence[int] | np.ndarray, salt: str | None = None) -> int:
        """Tokens of ``prompt`` a lookup would resume (0: none), the cache left as it is."""
        entry = self._deepest(self._chain(prompt, salt), whole=False)
        return 0 if entry is None else entry.checkpoint.length

    def _deepest(self, chain: _Chain, whole: bool) -> _Entry | None:
        for length in sorted({n for n, _ in self._entries}, reverse=True):
            if length > len(chain.ids):
                continue
            entry = self._match(chain, length)
            if entry is None:
                continue
            if length == len(chain.ids) and entry.checkpoint.logits is None and not whole:
                continue
            return entry
        return None

    def contains(self, tokens: Sequence[int] | np.ndarray, salt: str | None = None) -> bool:
        """Whether a checkpoint of exactly ``tokens`` is kept under ``salt``."""
        chain = self._chain(tokens, salt)
        return self._match(chain, len(chain.ids)) is not None

    def shared_lengths(self, prompt: np.ndarray, salt: str | None = None) -> list[int]:
        """For each checkpoint kept under ``salt`` that goes on past where it stops sharing
        tokens with ``prompt``, how many first tokens they share: a boundary up to there
        would have served the request that left it."""
        namespace = self._namespace(salt)
        return [
            n
            for entry in self._entries.values()
            if entry.namespace == namespace
            and (n := common_prefix(entry.tokens, prompt)) < len(entry.tokens)
        ]

    def count(self, prompt_tokens: int, hit: Checkpoint | None) -> None:
        """Record one admitted request's lookup."""
        self.stats.queried_tokens += prompt_tokens
        self.stats.hit_tokens += hit.length if hit is not None else 0

    def refresh(self, tokens: Sequence[int] | np.ndarray, salt: str | None = None) -> bool:
        """Whether a checkpoint of exactly ``tokens`` is kept under ``salt`` (it becomes
        the most recently used): then there is no need to keep another."""
        chain = self._chain(tokens, salt)
        if self._match(chain, len(chain.ids)) is None:
            return False
        self._entries.move_to_end(chain.key(len(chain.ids)))
        return True

    def insert(
        self,
        tokens: Sequence[int] | np.ndarray,
        checkpoint: Checkpoint,
        salt: str | None = None,
    ) -> None:
        """Keep ``checkpoint`` of the sequence that consumed ``tokens``, under ``salt`` (one
        already kept for the same tokens and salt is refreshed, and the new one let go)."""
        chain = self._chain(np.array(tokens, dtype=np.int64), salt)
        if len(chain.ids) != checkpoint.length:
            raise ValueError(f"{len(chain.ids)} tokens for a checkpoint of {checkpoint.length}")
        key = chain.key(len(chain.ids))
        if self._match(chain, len(chain.ids)) is not None:
            self._entries.move_to_end(key)
            self.pool.drop(checkpoint)
            return
        if key in self._entries:  # a hash collision: the newer one wins
            self.pool.drop(self._entries.pop(key).checkpoint)
        self._entries[key] = _Entry(chain.ids, chain.namespace, checkpoint)

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
                    for age, (key, (_, _, checkpoint)) in enumerate(self._entries.items())
                    if checkpoint is not keep
                    and ((own := self._own_pages(checkpoint, holders)) or not selective)
                ]
                if not candidates:
                    break
                _, _, key = min(candidates)
                self.pool.drop(self._entries.pop(key).checkpoint)
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
        return [entry.checkpoint for entry in self._entries.values()]

    def checkpoint_counts(self) -> dict[str, int]:
        """Checkpoints kept, by why they were kept (every kind of ``CHECKPOINT_KINDS``)."""
        counts = dict.fromkeys(CHECKPOINT_KINDS, 0)
        for entry in self._entries.values():
            counts[entry.checkpoint.kind] += 1
        return counts

    def clear(self) -> None:
        for entry in self._entries.values():
            self.pool.drop(entry.checkpoint)
        self._entries.clear()


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many first tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
