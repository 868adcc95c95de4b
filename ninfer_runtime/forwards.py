"""The three shapes of a ``ModelRunner.forward``: a chunk, a decode step, a multi-row step.

* a **chunk** runs any lanes of any lengths as one batch built on the host (row positions,
  RoPE rows): prompts, and anything the compiled steps do not take;
* a **decode step** runs one token per lane, every index (slot, position, page) on the
  device, so the step is compiled once per lane count and replayed every token;
* a **multi-row step** runs the same few tokens in every lane (a chat prompt's tail after
  its checkpoint) the way a speculative round's verification does: one compiled step of
  ``t`` rows per lane, the recurrent layers' records folded into their states at its end.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from .compiled_steps import CompiledSteps
from .errors import EngineError
from .models.base import ForwardOutput, Model
from .models.batch import Batch, DecodeIndex, Lane
from .state import ContextPool

Array = Any


def batch_of(model: Model, lanes: Sequence[Lane], positions: np.ndarray) -> Batch:
    """Lanes laid out as rows at host ``positions`` ([rows], or [3, rows] multimodal
    RoPE positions), with their RoPE rows."""
    cos, sin = model.rope(positions)
    return Batch(tuple(lanes), cos, sin)


def chunk(
    model: Model,
    lanes: list[Lane],
    ids: list[np.ndarray],
    last_only: bool,
    embeddings: Array | None = None,
    positions: np.ndarray | None = None,
) -> ForwardOutput:
    """The lanes as one host-built batch (``ModelRunner.forward`` says what ``embeddings``
    and ``positions`` replace)."""
    xp = model.backend.xp
    rows = lanes[-1].rows.stop
    if positions is None:
        positions = np.concatenate(
            [np.arange(ln.start, ln.start + ln.tokens) + ln.state.rope_delta for ln in lanes]
        )
    elif (positions := np.asarray(positions)).shape not in ((rows,), (3, rows)):
        raise EngineError(f"positions {positions.shape} for {rows} rows: need [rows] or [3, rows]")
    if embeddings is not None and tuple(embeddings.shape) != (rows, model.config.hidden):
        raise EngineError(
            f"embeddings {tuple(embeddings.shape)} for {rows} rows: need "
            f"[{rows}, {model.config.hidden}]"
        )
    pool = lanes[0].state.pool
    batch = batch_of(model, lanes, positions)
    ids_d = xp.asarray(np.concatenate(ids))
    h = model.hidden_states(ids_d, batch, pool, embeddings=embeddings)
    for lane in lanes:
        lane.state.length += lane.tokens

    hidden = [h[lane.rows] for lane in lanes]
    if last_only:
        last = xp.asarray([lane.rows.stop - 1 for lane in lanes])
        logits = model.logits(h[last])
        return ForwardOutput([logits[i : i + 1] for i in range(len(lanes))], hidden, logits)
    logits = model.logits(h)
    return ForwardOutput([logits[lane.rows] for lane in lanes], hidden)


def decode(
    model: Model, steps: CompiledSteps, lanes: list[Lane], ids: list[np.ndarray]
) -> ForwardOutput:
    """One token in every lane, as the compiled decode step for that many lanes (a model's
    optional ``stage_decode(pool, ids, slots)`` first does what the step would read on the
    host, so the step reads nothing back)."""
    states = [lane.state for lane in lanes]
    pool, n = states[0].pool, len(lanes)
    inputs = [
        np.concatenate(ids).astype(np.int32),
        np.asarray([s.slot for s in states], dtype=np.int32),
        np.asarray([s.length for s in states], dtype=np.int32),
    ]
    deltas = np.asarray([s.rope_delta for s in states], dtype=np.int32)
    variant, capture = step_variant(model, "decode", inputs[2], 1)
    shifted = bool(deltas.any())  # a lane after a prompt with images: RoPE rows at index + delta
    step = _decode_step(model, steps, pool, n, variant, capture, shifted)
    stage = getattr(model, "stage_decode", None)  # what a model reads on the host for the step
    if stage is not None:
        stage(pool, inputs[0], inputs[1])
    logits, h = step(*inputs, inputs[2] + deltas) if shifted else step(*inputs)
    for state in states:
        state.length += 1
    rows = [slice(i, i + 1) for i in range(len(lanes))]
    return ForwardOutput([logits[r] for r in rows], [h[r] for r in rows], logits)


def rows(
    model: Model, steps: CompiledSteps, lanes: list[Lane], ids: list[np.ndarray], last_only: bool
) -> ForwardOutput:
    """``t`` tokens in each lane as one compiled step: the rows of a verification (the
    recurrent layers record them), all of them then folded into the states."""
    states, t = [lane.state for lane in lanes], lanes[0].tokens
    pool, n = states[0].pool, len(lanes)

    def step_rows(ids: Array, slots: Array, lengths: Array) -> tuple[Array, Array]:
        xp = model.backend.xp
        positions = (lengths[:, None] + xp.arange(t, dtype=xp.int32)[None, :]).reshape(-1)
        h = hidden_rows(model, pool, ids, xp.repeat(slots, t), positions, t, variant=variant)
        model.commit(pool, slots, xp.full(n, t, dtype=xp.int32))
        return model.logits(h[t - 1 :: t] if last_only else h), h

    lengths = np.asarray([s.length for s in states], dtype=np.int32)
    variant, capture = step_variant(model, "rows", lengths, t)
    key = _key(("rows", n, t, last_only), variant)
    step = steps.get(pool, key, step_rows, [(n * t,), (n,), (n,)], capture)
    logits, h = step(
        np.concatenate(ids).astype(np.int32),
        np.asarray([s.slot for s in states], dtype=np.int32),
        lengths,
    )
    for state in states:
        state.length += t
    hidden = [h[i * t : (i + 1) * t] for i in range(n)]
    if last_only:
        return ForwardOutput([logits[i : i + 1] for i in range(n)], hidden, logits)
    return ForwardOutput([logits[i * t : (i + 1) * t] for i in range(n)], hidden)


def step_variant(
    model: Model, kind: str, lengths: np.ndarray, tokens: int
) -> tuple[Hashable | None, bool]:
    """What ``model`` chooses for a compiled step of ``kind`` whose lanes stand at
    ``lengths`` and read ``tokens`` rows each (its optional ``step_variant``, told the
    step's last position), and whether the step may be captured: (None, True) for a model
    that chooses nothing."""
    choose = getattr(model, "step_variant", None)
    if choose is None:
        return None, True
    return choose(kind, int(lengths.max()) + tokens - 1)


def _key(key: tuple[Any, ...], variant: Hashable | None) -> tuple[Any, ...]:
    """A compiled step's key, with the model's variant where it chose one."""
    return key if variant is None else (*key, variant)


def _decode_step(
    model: Model,
    steps: CompiledSteps,
    pool: ContextPool,
    lanes: int,
    variant: Hashable | None,
    capture: bool,
    shifted: bool,
) -> Any:
    """The decode step for ``lanes`` lanes of ``pool``, made once per ``variant`` (the
    model's choice; ``capture``: whether it may be captured): the backend may capture it (a
    CUDA graph per lane count) and replay it every token. ``shifted``: its RoPE rows are read
    at a fourth input (each row's position plus its lane's ``rope_delta``) instead of at the
    rows' sequence indices."""

    def rows(ids: Array, slots: Array, positions: Array, *rope_at: Array) -> Any:
        return _decode_rows(model, pool, ids, slots, positions, *rope_at, variant=variant)

    kind = "decode_shifted" if shifted else "decode"
    inputs = 4 if shifted else 3
    return steps.get(pool, _key((kind, lanes), variant), rows, [(lanes,)] * inputs, capture)


def _decode_rows(
    model: Model,
    pool: ContextPool,
    ids: Array,
    slots: Array,
    positions: Array,
    rope_at: Array | None = None,
    variant: Hashable | None = None,
) -> tuple[Array, Array]:
    """One token for each row, every index on the device: (logits, hidden) [N, ...]."""
    h = hidden_rows(model, pool, ids, slots, positions, rope_at=rope_at, variant=variant)
    return model.logits(h), h


def hidden_rows(
    model: Model,
    pool: ContextPool,
    ids: Array,
    slots: Array,
    positions: Array,
    tokens: int = 1,
    rope_at: Array | None = None,
    variant: Hashable | None = None,
) -> Array:
    """Hidden states of rows addressed by device (slot, position) indices, ``tokens``
    consecutive rows per lane; RoPE rows at ``rope_at`` when given, else at the
    positions; ``variant``: the model's choice for the step (``step_variant``)."""
    cos = sin = None
    table = model.rope_table(pool.max_context)
    if table is not None:
        at = positions if rope_at is None else rope_at
        cos, sin = table[0][at], table[1][at]
    index = DecodeIndex(slots, positions, pool.page_table, tokens, variant)
    batch = Batch((), cos, sin, index)
    return model.hidden_states(ids, batch, pool)
