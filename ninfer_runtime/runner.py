"""The model runner: everything around a model's math that every architecture shares.

A model (``models.base.Model``) only computes: hidden states, logits, the MTP block. The
runner drives it:

* lane planning: each ``forward`` lane is some tokens of one sequence; the lanes are checked
  (capacity, vocabulary, one pool, open states) and stacked into one batch of rows;
* batch building: row positions, their RoPE rows, and for a decode step the device index
  arrays (``DecodeIndex``) that address every lane's memory at once;
* prefill chunking, so a long prompt's activations stay bounded;
* decode steps, made once per lane count and handed to the backend to compile (a CUDA graph
  captured per lane count, replayed every token), for the pool they were made for;
* draft-and-verify rounds of speculative decoding (the MTP block proposes, one batched
  forward verifies, the accepted prefix commits) belong here too, on top of ``forward`` and
  ``mtp_logits``.

Pools are sized by ``ContextPool.for_budget``; ``new_pool`` and ``new_state`` fill in what the
model keeps per sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import EngineError, ModelError
from .models.base import ForwardOutput, Model
from .models.batch import Batch, DecodeIndex, Lane
from .state import PAGE_TOKENS, ContextPool, SequenceState

Array = Any


class ModelRunner:
    """Runs one model: lanes in, logits and hidden states out."""

    def __init__(self, model: Model):
        self.model = model
        self.backend = model.backend
        self.specs, self.mtp_spec = model.state_specs()
        # decode steps by lane count, all for ``_step_pool``: a captured step addresses that
        # pool's buffers, so a new pool gets new steps (and the old pool is let go)
        self._step_pool: ContextPool | None = None
        self._steps: dict[int, Any] = {}

    # ------------------------------------------------------------------------- state
    def new_pool(
        self,
        *,
        lanes: int,
        max_context: int,
        budget: int | None = None,
        page_tokens: int = PAGE_TOKENS,
        kv_dtype: str = "float32",
    ) -> ContextPool:
        """A pool for this model's layers (see ``ContextPool.for_budget``)."""
        return ContextPool.for_budget(
            self.specs,
            self.backend.xp,
            mtp=self.mtp_spec,
            lanes=lanes,
            max_context=max_context,
            budget=budget,
            page_tokens=page_tokens,
            kv_dtype=kv_dtype,
        )

    def new_state(self, max_context: int) -> SequenceState:
        """A sequence of up to ``max_context`` tokens in a pool of its own."""
        if max_context <= 0:
            raise EngineError(f"max_context must be positive, got {max_context}")
        pool = self.new_pool(
            lanes=1, max_context=max_context, page_tokens=min(PAGE_TOKENS, max_context)
        )
        return pool.open(max_context)

    # ----------------------------------------------------------------------- forward
    def forward(
        self,
        tokens_per_lane: Sequence[Array],
        states: Sequence[SequenceState],
        *,
        last_only: bool = False,
    ) -> ForwardOutput:
        """Advance every lane by its tokens; lanes share projections, not memory. One token
        in every lane is a decode step; anything else is a chunk."""
        lanes, ids = self._plan(tokens_per_lane, states)
        if all(lane.tokens == 1 for lane in lanes):
            return self._decode(lanes, ids)
        return self._chunk(lanes, ids, last_only)

    def prefill(self, tokens: Array, state: SequenceState, *, chunk: int = 512) -> ForwardOutput:
        """A whole prompt through ``forward`` in chunks of ``chunk`` tokens, so activations stay
        bounded; returns the last chunk's logits and every chunk's hidden rows."""
        tokens = np.asarray(tokens)
        self._check_capacity(0, len(tokens), state)
        hidden, out = [], None
        for a in range(0, len(tokens), chunk):
            out = self.forward([tokens[a : a + chunk]], [state])
            hidden.append(out.hidden[0])
        if out is None:
            raise EngineError("prefill needs at least one token")
        return ForwardOutput(out.logits, [self.backend.xp.concatenate(hidden)])

    def mtp_logits(
        self,
        hidden: Array,
        next_token_ids: Array,
        state: SequenceState,
        *,
        start: int | None = None,
    ) -> Array:
        """Draft logits for the tokens after ``next_token_ids`` (the model's MTP block).

        Row i pairs main-model hidden state ``start + i`` with the token at ``start + i + 1``;
        ``start`` defaults to the MTP cache length, so successive calls continue the sequence
        (pass an earlier ``start`` to overwrite rejected draft entries).
        """
        if not self.model.has_mtp:
            raise ModelError("artifact has no mtp component")
        memory = state.pool.mtp
        if memory is None:
            raise EngineError("this state was made without an MTP cache")
        start = state.mtp_length if start is None else start
        ids = np.asarray(next_token_ids).reshape(-1)
        t, width = len(ids), self.model.config.hidden
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
        self._check_ids(ids, "mtp_logits")
        positions = np.arange(start + 1, start + 1 + t)  # positions of the embedded tokens
        batch = self.batch([Lane(slice(0, t), start, state)], positions)
        logits = self.model.mtp_logits(hidden, self.backend.xp.asarray(ids), batch, memory)
        state.mtp_length = start + t
        return logits

    def batch(self, lanes: Sequence[Lane], positions: np.ndarray) -> Batch:
        """Lanes laid out as rows at host ``positions``, with their RoPE rows."""
        cos, sin = self.model.rope(positions)
        return Batch(tuple(lanes), cos, sin)

    # ----------------------------------------------------------------------- chunks
    def _chunk(self, lanes: list[Lane], ids: list[np.ndarray], last_only: bool) -> ForwardOutput:
        xp, model = self.backend.xp, self.model
        positions = np.concatenate([np.arange(ln.start, ln.start + ln.tokens) for ln in lanes])
        pool = lanes[0].state.pool
        h = model.hidden_states(xp.asarray(np.concatenate(ids)), self.batch(lanes, positions), pool)
        for lane in lanes:
            lane.state.length += lane.tokens

        hidden = [h[lane.rows] for lane in lanes]
        if last_only:
            last = xp.asarray([lane.rows.stop - 1 for lane in lanes])
            logits = model.logits(h[last])
            return ForwardOutput([logits[i : i + 1] for i in range(len(lanes))], hidden, logits)
        logits = model.logits(h)
        return ForwardOutput([logits[lane.rows] for lane in lanes], hidden)

    # ----------------------------------------------------------------------- decoding
    def _decode(self, lanes: list[Lane], ids: list[np.ndarray]) -> ForwardOutput:
        states = [lane.state for lane in lanes]
        logits, h = self._decode_step(states[0].pool, len(lanes))(
            np.concatenate(ids).astype(np.int32),
            np.asarray([s.slot for s in states], dtype=np.int32),
            np.asarray([s.length for s in states], dtype=np.int32),
        )
        for state in states:
            state.length += 1
        rows = [slice(i, i + 1) for i in range(len(lanes))]
        return ForwardOutput([logits[r] for r in rows], [h[r] for r in rows], logits)

    def _decode_step(self, pool: ContextPool, lanes: int) -> Any:
        """The decode step for ``lanes`` lanes of ``pool``, made once: the backend may
        capture it (a CUDA graph per lane count) and replay it every token."""
        if pool is not self._step_pool:
            self._step_pool, self._steps = pool, {}
        step = self._steps.get(lanes)
        if step is None:
            self.model.rope_table(pool.max_context)  # sized before any capture
            step = self.backend.compile_step(
                lambda ids, slots, positions: self._decode_rows(pool, ids, slots, positions),
                lanes,
            )
            self._steps[lanes] = step
        return step

    def _decode_rows(
        self, pool: ContextPool, ids: Array, slots: Array, positions: Array
    ) -> tuple[Array, Array]:
        """One token for each row, every index on the device: (logits, hidden) [N, ...]."""
        cos = sin = None
        table = self.model.rope_table(pool.max_context)
        if table is not None:
            cos, sin = table[0][positions], table[1][positions]
        batch = Batch((), cos, sin, DecodeIndex(slots, positions, pool.page_table))
        h = self.model.hidden_states(ids, batch, pool)
        return self.model.logits(h), h

    # ----------------------------------------------------------------------- checks
    def _plan(
        self, tokens_per_lane: Sequence[Array], states: Sequence[SequenceState]
    ) -> tuple[list[Lane], list[np.ndarray]]:
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
            if len(state.pool.layers) != len(self.specs):
                raise EngineError(
                    f"lane {i}: state has {len(state.pool.layers)} layers, the model "
                    f"{len(self.specs)} (made by another model?)"
                )
            self._check_capacity(i, len(toks), state)
            self._check_ids(toks, f"lane {i}")
            if state.pool is not states[0].pool:
                raise EngineError(f"lane {i}: its state lives in another context pool")
            if state.slot < 0:
                raise EngineError(f"lane {i}: its state was closed")
            lanes.append(Lane(slice(row, row + len(toks)), state.length, state))
            ids.append(toks.astype(np.int64))
            row += len(toks)
        return lanes, ids

    @staticmethod
    def _check_capacity(lane: int, tokens: int, state: SequenceState) -> None:
        if tokens == 0:
            raise EngineError(f"lane {lane}: no tokens to process")
        if tokens > state.free:
            raise EngineError(
                f"lane {lane}: {tokens} tokens do not fit: the state holds {state.length} of "
                f"max_context {state.max_context} ({state.free} free)"
            )

    def _check_ids(self, ids: np.ndarray, where: str) -> None:
        vocab = self.model.config.vocab
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            bad = int(ids.max()) if ids.max() >= vocab else int(ids.min())
            raise EngineError(f"{where}: token id {bad} outside the vocabulary 0..{vocab - 1}")
