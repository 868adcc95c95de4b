"""A forward's lanes, checked and laid out as rows of one batch.

Each lane of ``ModelRunner.forward`` is some tokens of one sequence. Before anything runs,
every lane is checked (room in its state, token ids in the vocabulary, one pool, an open
state, a state made for this model's layers) so that a bad call fails with a one-line error
naming the lane and leaves every state as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import EngineError
from .models.batch import Lane, Mark
from .sequence_state import SequenceState

Array = Any


def plan_lanes(
    tokens_per_lane: Sequence[Array],
    states: Sequence[SequenceState],
    *,
    layers: int,
    vocab: int,
    marks: Sequence[Sequence[Mark]] | None = None,
) -> tuple[list[Lane], list[np.ndarray]]:
    """The lanes as consecutive rows (``Lane``), and each lane's token ids (int64), for a
    model of ``layers`` layers and ``vocab`` tokens; ``marks``: each lane's checkpoints kept
    inside its rows."""
    if len(tokens_per_lane) != len(states):
        raise EngineError(
            f"forward got {len(tokens_per_lane)} token lanes but {len(states)} states"
        )
    if not states:
        raise EngineError("forward needs at least one lane")
    if len({id(s) for s in states}) != len(states):
        raise EngineError("the same state appears in two lanes of one forward call")
    lanes, ids, row = [], [], 0
    for i, (tokens, state) in enumerate(zip(tokens_per_lane, states, strict=True)):
        toks = np.asarray(tokens).reshape(-1)
        if len(state.pool.layers) != layers:
            raise EngineError(
                f"lane {i}: state has {len(state.pool.layers)} layers, the model "
                f"{layers} (made by another model?)"
            )
        check_capacity(i, len(toks), state)
        check_ids(toks, vocab, f"lane {i}")
        if state.pool is not states[0].pool:
            raise EngineError(f"lane {i}: its state lives in another context pool")
        if state.slot < 0:
            raise EngineError(f"lane {i}: its state was closed")
        kept = tuple(marks[i]) if marks else ()
        lanes.append(Lane(slice(row, row + len(toks)), state.length, state, kept))
        ids.append(toks.astype(np.int64))
        row += len(toks)
    return lanes, ids


def check_capacity(lane: int, tokens: int, state: SequenceState) -> None:
    """Lane ``lane``'s ``tokens`` tokens fit in ``state``'s free room (and there are some)."""
    if tokens == 0:
        raise EngineError(f"lane {lane}: no tokens to process")
    if tokens > state.free:
        raise EngineError(
            f"lane {lane}: {tokens} tokens do not fit: the state holds {state.length} of "
            f"max_context {state.max_context} ({state.free} free)"
        )


def check_ids(ids: np.ndarray, vocab: int, where: str) -> None:
    """Every id of ``ids`` is in the vocabulary 0..vocab-1 (``where``: who passed them)."""
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        bad = int(ids.max()) if ids.max() >= vocab else int(ids.min())
        raise EngineError(f"{where}: token id {bad} outside the vocabulary 0..{vocab - 1}")
