"""Where a request's prefill keeps checkpoints besides its prompt's end and the interval.

A request names positions where other requests are likely to share its prompt and then
differ (``CacheBoundary``: the end of the system message, of the tool definitions, of an
earlier message; a breakpoint its client marked). Each checkpoint costs a snapshot of the
recurrent state (about 150 MiB on the 27B model), so at most ``MAX_NEW_CHECKPOINTS`` of them
are kept per request, those of most expected value: the prefill tokens a later request
would skip by resuming there (the position) times the requests that would, counted as one
for this prompt's own future plus one per other live request (running or queued, same
salt) and per cached checkpoint that share the prompt up to there. Client breakpoints go
before structural boundaries of the same value, then the deeper. Positions that need no new
checkpoint cost nothing and take no place among them: those at or before where the request
resumed, those already kept for the same tokens and salt, and those the engine keeps
anyway (every ``checkpoint_interval`` tokens, where a chat prompt stops being what the next
turn resends).

Requests arriving together would all look the cache up before any of them had read the
prompt they share: a request reading its prompt for the first time may instead wait for the
deepest checkpoint a lane still reading a prompt it shares will keep
(``pending_checkpoints``, ``awaited_position``); the engine decides whether that is worth
waiting for.
"""

from __future__ import annotations

import numbers
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from .errors import RequestError
from .prefix_cache import CacheBoundary, common_prefix

#: new boundary checkpoints one request's prefill may keep
MAX_NEW_CHECKPOINTS = 4


def merge_boundaries(boundaries: Iterable[CacheBoundary]) -> dict[int, str]:
    """Position -> kind, one entry per position (a client's breakpoint wins over a
    structural boundary at the same place)."""
    kinds: dict[int, str] = {}
    for b in boundaries:
        if kinds.get(b.position) != "breakpoint":
            kinds[b.position] = b.kind
    return kinds


def choose_checkpoints(
    boundaries: Iterable[CacheBoundary],
    *,
    prompt_tokens: int,
    resumed: int,
    kept_anyway: Callable[[int], bool],
    exists: Callable[[int], bool],
    shared_lengths: Sequence[int],
) -> dict[int, str]:
    """The boundary positions to keep checkpoints at, with their kinds: every one the engine
    keeps anyway (it takes the boundary's kind) and up to ``MAX_NEW_CHECKPOINTS`` new ones by
    expected value. ``shared_lengths``: for each other live request and cached checkpoint,
    how many first tokens of this prompt it shares."""
    plan: dict[int, str] = {}
    scored = []
    lengths = sorted(shared_lengths)
    for position, kind in merge_boundaries(boundaries).items():
        if not resumed < position < prompt_tokens:
            continue
        if kept_anyway(position):
            if not exists(position):
                plan[position] = kind
            continue
        sharers = len(lengths) - bisect_left(lengths, position)
        scored.append((position * (1 + sharers), kind == "breakpoint", position, kind))
    # ``exists`` hashes the prompt up to the position: asked of the best candidates only,
    # until enough are new, so a request naming thousands of boundaries costs few of them
    new = 0
    for _, _, position, kind in sorted(scored, reverse=True):
        if new == MAX_NEW_CHECKPOINTS:
            break
        if not exists(position):
            plan[position] = kind
            new += 1
    return plan


def check_cache_fields(salt: Any, boundaries: Iterable[Any], prompt_tokens: int) -> None:
    """A request's ``cache_salt`` is text or None and its ``cache_boundaries`` are
    ``CacheBoundary`` positions inside its prompt (one at its very end adds nothing: the
    prompt's end is always kept); else ``RequestError`` naming the field."""
    if salt is not None and not isinstance(salt, str):
        raise RequestError(
            f"cache_salt must be a string, got {type(salt).__name__}", param="cache_salt"
        )
    if salt is not None and not salt.isascii():
        try:  # the cache keys its namespace by the salt's UTF-8 bytes
            salt.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(
                "cache_salt is not valid Unicode text (it holds a lone surrogate)",
                param="cache_salt",
            ) from None
    for b in boundaries:
        if not isinstance(b, CacheBoundary) or b.kind not in ("boundary", "breakpoint"):
            raise RequestError(
                f"cache_boundaries: {b!r} is not a CacheBoundary of kind 'boundary' or "
                "'breakpoint'",
                param="cache_boundaries",
            )
        if isinstance(b.position, bool) or not isinstance(b.position, numbers.Integral):
            raise RequestError(
                f"cache_boundaries: position {b.position!r} is not a token count",
                param="cache_boundaries",
            )
        if not 0 < b.position <= prompt_tokens:
            raise RequestError(
                f"cache_boundaries: position {b.position} is outside the "
                f"{prompt_tokens}-token prompt (expected 1..{prompt_tokens})",
                param="cache_boundaries",
            )


def pending_checkpoints(
    planned: Iterable[int], *, prefilled: int, prompt_tokens: int, interval: int
) -> list[int]:
    """The positions where a prefill that has read ``prefilled`` of its ``prompt_tokens``
    tokens will still keep checkpoints: its ``planned`` ones (``choose_checkpoints``), every
    ``interval`` tokens, and its end."""
    start = prefilled + 1
    intervals = range(-(-start // interval) * interval, prompt_tokens, interval)
    return [*(p for p in planned if p >= start), *intervals, prompt_tokens]


def awaited_position(
    prompt: np.ndarray, writers: Iterable[tuple[np.ndarray, Iterable[int]]]
) -> int:
    """The deepest checkpoint ``prompt`` could resume from among those ``writers`` (a
    prompt still being read, and ``pending_checkpoints`` of its prefill) will keep; 0: none.
    A checkpoint of all of ``prompt`` serves only with its last logits, which a writer keeps
    at its own prompt's end only."""
    deepest = 0
    for tokens, pending in writers:
        shared = common_prefix(tokens, prompt)
        for p in pending:
            if p <= shared and (p < len(prompt) or p == len(tokens)):
                deepest = max(deepest, p)
    return deepest
