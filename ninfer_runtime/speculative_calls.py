"""The runner's speculative-decoding calls, on the host side: the drafter's entries
(``mtp_logits``, ``mtp_prefill``), a draft-and-verify pass (``speculate``, its device side
compiled from ``speculative_step``) and the fold of its accepted tokens (``commit``). Each
checks its lanes and lays them out; ``ModelRunner`` documents them and calls them here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .backends.base import to_numpy
from .errors import EngineError, ModelError
from .lane_plan import check_capacity, check_ids
from .models.batch import Lane
from .speculative_step import Proposal, speculate_rows
from .state import SequenceState

if TYPE_CHECKING:
    from .runner import ModelRunner

Array = Any


def mtp_logits(
    runner: ModelRunner,
    hidden: Array,
    next_token_ids: Array,
    state: SequenceState,
    *,
    start: int | None = None,
) -> Array:
    """Draft logits for the tokens after ``next_token_ids`` (``ModelRunner.mtp_logits``)."""
    if not runner.model.has_mtp:
        raise ModelError("artifact has no mtp component")
    memory = state.pool.mtp
    if memory is None:
        raise EngineError("this state was made without an MTP cache")
    start = state.mtp_length if start is None else start
    ids = np.asarray(next_token_ids).reshape(-1)
    t, width = len(ids), runner.model.config.hidden
    if hidden.shape != (t, width):
        raise EngineError(
            f"mtp_logits: hidden is {tuple(hidden.shape)}, expected ({t}, {width})"
            " (one row per next token)"
        )
    if not 0 <= start <= state.mtp_length:
        raise EngineError(f"mtp_logits: start {start} outside 0..{state.mtp_length}")
    if start + t > state.max_context:
        raise EngineError(
            f"mtp_logits: {t} entries from slot {start} exceed max_context {state.max_context}"
        )
    check_ids(ids, runner.model.config.vocab, "mtp_logits")
    # the embedded tokens' positions (after a prompt with images: index + rope_delta)
    positions = np.arange(start + 1, start + 1 + t) + state.rope_delta
    batch = runner.batch([Lane(slice(0, t), start, state)], positions)
    logits = runner.model.mtp_logits(hidden, runner.backend.xp.asarray(ids), batch, memory)
    state.mtp_length = start + t
    return logits


def mtp_prefill(
    runner: ModelRunner,
    hidden: Array,
    next_ids: Array,
    state: SequenceState,
    positions: np.ndarray | None = None,
    embeddings: Array | None = None,
) -> None:
    """The drafter's entries for a prompt chunk just prefilled (``ModelRunner.mtp_prefill``)."""
    ids = np.asarray(next_ids).reshape(-1)
    t, rows = len(ids), hidden.shape[0]
    memory, kept = state.pool.mtp, state.pool.draft_hidden
    if memory is None or kept is None:
        raise EngineError("mtp_prefill: this pool was made without draft_tokens")
    if rows not in (t, t + 1):
        raise EngineError(f"mtp_prefill: {rows} hidden rows for {t} next tokens")
    if t:
        check_ids(ids, runner.model.config.vocab, "mtp_prefill")
        start = state.mtp_length
        if positions is None:
            positions = np.arange(start + 1, start + 1 + t) + state.rope_delta
        elif (positions := np.asarray(positions)).shape not in ((t,), (3, t)):
            raise EngineError(f"mtp_prefill: positions {positions.shape} for {t} tokens")
        batch = runner.batch([Lane(slice(0, t), start, state)], positions)
        next_ids = runner.backend.xp.asarray(ids)
        if embeddings is None:
            runner.model.mtp_hidden(hidden[:t], next_ids, batch, memory)
        else:
            runner.model.mtp_hidden(hidden[:t], next_ids, batch, memory, embeddings[:t])
        state.mtp_length = start + t
    if rows > t:
        kept[state.slot, 0] = hidden[t]
        state.draft_carry = []


def speculate(
    runner: ModelRunner,
    states: Sequence[SequenceState],
    pending: Sequence[int],
    draft_tokens: int,
    *,
    optimized_head: bool = True,
) -> Proposal:
    """One draft-and-verify pass for every lane (``ModelRunner.speculate``)."""
    n, t = len(states), draft_tokens + 1
    if draft_tokens < 1:
        raise EngineError(f"speculate needs at least one draft token, got {draft_tokens}")
    if len(pending) != n or not n:
        raise EngineError(f"speculate got {len(pending)} pending tokens for {n} lanes")
    pool = states[0].pool
    if pool.draft_hidden is None or pool.draft_hidden.shape[1] < t:
        raise EngineError(f"speculate: this pool was not made for {draft_tokens} drafts")
    carry = np.zeros((n, t), dtype=np.int32)
    last = np.zeros(n, dtype=np.int32)
    for i, (s, token) in enumerate(zip(states, pending, strict=True)):
        if s.pool is not pool or s.slot < 0:
            raise EngineError(f"lane {i}: its state is closed or lives in another pool")
        row = [*s.draft_carry, int(token)]
        if s.mtp_length + len(row) != s.length or len(row) > t:
            raise EngineError(
                f"lane {i}: MTP entries ({s.mtp_length} + {len(row)}) are out of step "
                f"with the sequence ({s.length}); prefill it with mtp_prefill"
            )
        check_capacity(i, t, s)
        check_ids(np.asarray(row), runner.model.config.vocab, f"lane {i}")
        carry[i, : len(row)], carry[i, len(row) :], last[i] = row, row[-1], len(row) - 1
    slots = np.asarray([s.slot for s in states], dtype=np.int32)
    lengths = np.asarray([s.length for s in states], dtype=np.int32)
    starts = np.asarray([s.mtp_length for s in states], dtype=np.int32)
    inputs = [slots, lengths, starts, last, carry]
    deltas = np.asarray([s.rope_delta for s in states], dtype=np.int32)
    shifted = bool(deltas.any())  # a lane after a prompt with images: RoPE at index + delta
    if shifted:  # a step of its own, as for decoding, so text-only rounds are unchanged
        inputs.append(deltas)
    step = runner.steps.get(
        pool,
        ("speculate_shifted" if shifted else "speculate", n, t, optimized_head),
        lambda *inputs: speculate_rows(runner.model, pool, t, optimized_head, *inputs),
        [(n,), (n,), (n,), (n,), (n, t)] + [(n,)] * shifted,
    )
    tokens, logits = step(*inputs)
    tokens = to_numpy(tokens)  # the round's one host synchronisation
    return Proposal(tokens[:, :draft_tokens], tokens[:, draft_tokens:], logits)


def commit(
    runner: ModelRunner, states: Sequence[SequenceState], accepted: Sequence[Sequence[int]]
) -> None:
    """The accepted part of a round made permanent (``ModelRunner.commit``)."""
    if len(accepted) != len(states) or not states:
        raise EngineError(f"commit got {len(accepted)} accepted lists for {len(states)} lanes")
    pool, n = states[0].pool, len(states)
    counts = np.asarray([len(a) + 1 for a in accepted], dtype=np.int32)

    def fold(slots: Array, counts: Array) -> tuple[()]:
        runner.model.commit(pool, slots, counts)
        return ()  # a step with no outputs

    step = runner.steps.get(pool, ("commit", n), fold, [(n,), (n,)])
    step(np.asarray([s.slot for s in states], dtype=np.int32), counts)
    for s, kept in zip(states, accepted, strict=True):
        s.mtp_length = s.length
        s.length += len(kept) + 1
        s.draft_carry = [int(t) for t in kept]
