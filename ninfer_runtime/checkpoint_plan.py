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
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence

from .prefix_cache import CacheBoundary

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
