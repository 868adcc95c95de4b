"""Speculative decoding timed at the runner: rounds (``speculate`` + ``commit``) against a plain
step, and one MTP draft step scoring the proposal rows and the full vocabulary."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..arrays import sync
from ..models.batch import Batch, DecodeIndex
from ..runner import ModelRunner
from .costs import draft_step_bytes, round_bytes
from .probes import median_seconds
from .rates import fill_random
from .results import DraftStepResult, SpecResult


def _speculating_pool(
    runner: ModelRunner, lanes: int, room: int, draft_tokens: int, kv_dtype: str, seed: int
) -> tuple[Any, list[Any]]:
    """A pool of ``lanes`` sequences of ``room`` tokens for rounds of ``draft_tokens``,
    random K/V, states and kept hidden rows."""
    xp = runner.backend.xp
    pool = runner.new_pool(
        lanes=lanes, max_context=room, kv_dtype=kv_dtype, draft_tokens=draft_tokens
    )
    states = [pool.open(room) for _ in range(lanes)]
    fill_random(pool, xp, seed)
    rng = np.random.default_rng(seed)
    pool.draft_hidden[...] = xp.asarray(rng.standard_normal(pool.draft_hidden.shape), xp.float32)
    return pool, states


def spec_round_rate(
    runner: ModelRunner,
    lanes: int,
    context: int,
    draft_tokens: int,
    *,
    step_ms: float,
    floor_bw: float,
    rounds: int = 16,
    warmup: int = 3,
    kv_dtype: str = "float32",
    optimized_head: bool = True,
) -> SpecResult:
    """Median time of a round (``speculate`` then ``commit``) of ``lanes`` lanes at
    ``context`` tokens, against a plain step of ``step_ms``. Every round commits all its
    drafts (the most the commit replays) so the lanes advance by K+1 tokens a round."""
    k = draft_tokens
    room = context + (warmup + rounds + 1) * (k + 1)
    _, states = _speculating_pool(runner, lanes, room, k, kv_dtype, lanes * 7919 + context + k)
    for s in states:  # as if the prompt's `context` tokens were read, MTP entries included
        s.length, s.mtp_length, s.draft_carry = context, context - 1, []
    pending = np.random.default_rng(k).integers(0, runner.model.config.vocab, lanes)
    xp, times = runner.backend.xp, []
    for _ in range(warmup + rounds):
        sync(xp)
        start = time.perf_counter()
        proposal = runner.speculate(states, pending, k, optimized_head=optimized_head)
        runner.commit(states, [list(d) for d in proposal.drafts])
        sync(xp)
        times.append(time.perf_counter() - start)
        pending = proposal.targets[:, k]
    round_ms = 1e3 * float(np.median(times[warmup:]))
    moved = round_bytes(runner.model, lanes, context, k, kv_dtype, optimized=optimized_head)
    return SpecResult(lanes, context, k, step_ms, round_ms, moved, 1e3 * moved / floor_bw)


def draft_step_rate(
    runner: ModelRunner,
    lanes: int,
    context: int,
    *,
    floor_bw: float,
    repeats: int = 16,
    kv_dtype: str = "float32",
) -> DraftStepResult:
    """One MTP draft step of ``lanes`` lanes at ``context`` MTP entries (the block, then its
    most likely token), compiled as the round's steps are, scoring the proposal head's rows
    and the full vocabulary."""
    model, be = runner.model, runner.backend
    xp = be.xp
    room = context + 2
    pool, _ = _speculating_pool(runner, lanes, room, 1, kv_dtype, lanes + context)
    hidden = xp.ascontiguousarray(pool.draft_hidden[:lanes, 0])
    table = model.rope_table(room + 1)
    args = (
        np.arange(lanes, dtype=np.int32),
        np.full(lanes, context, dtype=np.int32),
        np.random.default_rng(lanes).integers(0, model.config.vocab, lanes).astype(np.int32),
    )

    def ms(optimized: bool) -> float:
        def step(slots: Any, entries: Any, ids: Any) -> Any:
            index = DecodeIndex(slots, entries, pool.page_table)
            cos, sin = (table[0][entries + 1], table[1][entries + 1]) if table else (None, None)
            x = model.mtp_hidden(hidden, ids, Batch((), cos, sin, index), pool.mtp)
            return model.propose(x, optimized=optimized)

        compiled = be.compile_step(step, [(lanes,)] * 3)
        return 1e3 * median_seconds(xp, lambda: compiled(*args), repeats)

    rows = model.proposal_head.shape[0] if model.proposal_head is not None else 0
    return DraftStepResult(
        lanes,
        context,
        rows,
        ms(True),
        ms(False),
        draft_step_bytes(model, lanes, context, kv_dtype, optimized=True),
        draft_step_bytes(model, lanes, context, kv_dtype, optimized=False),
        floor_bw,
    )
