"""The model runner: everything around a model's math that every architecture shares.

A model (``models.base.Model``) only computes: hidden states, logits, the MTP block. The
runner drives it:

* lane planning: each ``forward`` lane is some tokens of one sequence; the lanes are checked
  (capacity, vocabulary, one pool, open states) and stacked into one batch of rows;
* batch building: row positions, their RoPE rows, and for a decode step the device index
  arrays (``DecodeIndex``) that address every lane's memory at once;
* prefill chunking, so a long prompt's activations stay bounded;
* decode steps, made once per lane count and handed to the backend to compile (a CUDA graph
  captured per lane count, replayed every token), for the pool they were made for; a few
  tokens per lane (a chat prompt's tail after its checkpoint) run the same way, as one
  compiled step of several rows per lane, when the pool was made with room for them;
* draft-and-verify rounds of speculative decoding: ``speculate`` lets the MTP block propose
  K tokens per lane and verifies them with one batched forward of K+1 rows per lane (one
  compiled step); ``commit`` then folds the accepted prefix into the recurrent states
  (``gdn_verify`` / ``gdn_commit``: exact, the states equal plain decoding's).

Pools are sized by ``ContextPool.for_budget``; ``new_pool`` and ``new_state`` fill in what the
model keeps per sequence.

The runner is the API; the pieces live beside it: ``lane_plan`` (lanes checked and laid out
as rows), ``forwards`` (a chunk, a decode step, a multi-row step), ``compiled_steps`` (the
steps compiled once per shape for one pool) and ``speculative_step`` (the device side of a
draft-and-verify pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import forwards
from .backends.base import to_numpy
from .compiled_steps import CompiledSteps
from .errors import EngineError, ModelError
from .lane_plan import check_capacity, check_ids, plan_lanes
from .models.base import ForwardOutput, Model
from .models.batch import Batch, Lane
from .speculative_step import Proposal, speculate_rows
from .state import PAGE_TOKENS, ContextPool, DraftSpec, SequenceState

Array = Any


class ModelRunner:
    """Runs one model: lanes in, logits and hidden states out."""

    def __init__(self, model: Model):
        self.model = model
        self.backend = model.backend
        self.specs, self.mtp_spec = model.state_specs()
        #: decode steps, multi-row steps and rounds, compiled once per shape for one pool
        self.steps = CompiledSteps(model)

    # ------------------------------------------------------------------------- state
    def new_pool(
        self,
        *,
        lanes: int,
        max_context: int,
        budget: int | None = None,
        page_tokens: int = PAGE_TOKENS,
        kv_dtype: str = "float32",
        draft_tokens: int = 0,
        step_rows: int = 1,
        snapshots: int = 0,
    ) -> ContextPool:
        """A pool for this model's layers (see ``ContextPool.for_budget``); ``draft_tokens``
        > 0 adds what speculative rounds of that many drafts keep per sequence, and
        ``step_rows`` > 1 lets ``forward`` run up to that many tokens per lane as one
        compiled step."""
        draft = None
        if draft_tokens:
            if not self.model.has_mtp:
                raise ModelError("artifact has no mtp component: speculative decoding needs one")
            draft = DraftSpec(draft_tokens + 1, self.model.config.hidden)
        return ContextPool.for_budget(
            self.specs,
            self.backend.xp,
            mtp=self.mtp_spec,
            draft=draft,
            step_rows=step_rows,
            snapshots=snapshots,
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
        embeddings: Array | None = None,
        positions: np.ndarray | None = None,
    ) -> ForwardOutput:
        """Advance every lane by its tokens; lanes share projections, not memory. One token
        in every lane is a decode step; the same few tokens in every lane, no more than the
        pool's ``step_rows``, a compiled step of that many rows per lane; anything else is a
        chunk.

        A prompt with images (``multimodal``) runs as a chunk with ``embeddings`` (device
        [rows, H]: the layers' input instead of the tokens' embeddings) and ``positions``
        (host [rows] or [3, rows]: the RoPE positions instead of the rows' sequence indices;
        the cache is still written at the sequence indices). Without ``positions`` a row's
        position is its sequence index plus its state's ``rope_delta`` (a sequence after a
        prompt with images)."""
        lanes, ids = plan_lanes(
            tokens_per_lane, states, layers=len(self.specs), vocab=self.model.config.vocab
        )
        if embeddings is not None or positions is not None:
            return self._chunk(lanes, ids, last_only, embeddings, positions)
        tokens = {lane.tokens for lane in lanes}
        if tokens == {1}:
            return forwards.decode(self.model, self.steps, lanes, ids)
        shifted = any(s.rope_delta for s in states)  # the compiled rows read RoPE by index
        if len(tokens) == 1 and max(tokens) <= states[0].pool.step_rows and not shifted:
            return forwards.rows(self.model, self.steps, lanes, ids, last_only)
        return self._chunk(lanes, ids, last_only)

    def prefill(
        self,
        tokens: Array,
        state: SequenceState,
        *,
        chunk: int = 512,
        last_only: bool = False,
        embeddings: Array | None = None,
        positions: np.ndarray | None = None,
    ) -> ForwardOutput:
        """A whole prompt through ``forward`` in chunks of ``chunk`` tokens, so activations stay
        bounded; returns the last chunk's logits (``last_only``: its last row's, as a served
        prompt needs) and every chunk's hidden rows. Earlier chunks compute no more than
        their last row's logits. ``embeddings`` [T, H] and ``positions`` ([T] or [3, T]),
        when given, are the whole prompt's (see ``forward``), cut into the same chunks."""
        tokens = np.asarray(tokens)
        check_capacity(0, len(tokens), state)
        hidden, out = [], None
        for a in range(0, len(tokens), chunk):
            final = a + chunk >= len(tokens)
            out = self.forward(
                [tokens[a : a + chunk]],
                [state],
                last_only=last_only or not final,
                embeddings=None if embeddings is None else embeddings[a : a + chunk],
                positions=None if positions is None else positions[..., a : a + chunk],
            )
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
        # the embedded tokens' positions (after a prompt with images: index + rope_delta)
        positions = np.arange(start + 1, start + 1 + t) + state.rope_delta
        batch = self.batch([Lane(slice(0, t), start, state)], positions)
        logits = self.model.mtp_logits(hidden, self.backend.xp.asarray(ids), batch, memory)
        state.mtp_length = start + t
        return logits

    def batch(self, lanes: Sequence[Lane], positions: np.ndarray) -> Batch:
        """Lanes laid out as rows at host ``positions`` ([rows], or [3, rows] multimodal
        RoPE positions), with their RoPE rows."""
        return forwards.batch_of(self.model, lanes, positions)

    def _chunk(
        self,
        lanes: list[Lane],
        ids: list[np.ndarray],
        last_only: bool,
        embeddings: Array | None = None,
        positions: np.ndarray | None = None,
    ) -> ForwardOutput:
        return forwards.chunk(self.model, lanes, ids, last_only, embeddings, positions)

    # ------------------------------------------------------------ speculative decoding
    def mtp_prefill(
        self,
        hidden: Array,
        next_ids: Array,
        state: SequenceState,
        positions: np.ndarray | None = None,
        embeddings: Array | None = None,
    ) -> None:
        """The drafter's view of a prompt chunk just prefilled: ``hidden`` [t, H] are the
        chunk's rows (positions ``state.mtp_length`` on) and ``next_ids`` the prompt tokens
        after them. Rows with a next token become MTP entries; a row without one (the
        prompt's last) is kept for the first ``speculate``, which pairs it with the token
        sampled from it. ``positions`` (host [t] or [3, t]): the RoPE positions of the
        ``next_ids``, a prompt's with images; by default their sequence indices plus the
        state's ``rope_delta``. ``embeddings`` [t, H]: the next tokens' input rows, a
        prompt's with its images' rows placed (the model's ``mtp_hidden`` takes them: a
        Qwen3.5 VLM's), instead of their token embeddings."""
        ids = np.asarray(next_ids).reshape(-1)
        t, rows = len(ids), hidden.shape[0]
        memory, kept = state.pool.mtp, state.pool.draft_hidden
        if memory is None or kept is None:
            raise EngineError("mtp_prefill: this pool was made without draft_tokens")
        if rows not in (t, t + 1):
            raise EngineError(f"mtp_prefill: {rows} hidden rows for {t} next tokens")
        if t:
            self._check_ids(ids, "mtp_prefill")
            start = state.mtp_length
            if positions is None:
                positions = np.arange(start + 1, start + 1 + t) + state.rope_delta
            elif (positions := np.asarray(positions)).shape not in ((t,), (3, t)):
                raise EngineError(f"mtp_prefill: positions {positions.shape} for {t} tokens")
            batch = self.batch([Lane(slice(0, t), start, state)], positions)
            next_ids = self.backend.xp.asarray(ids)
            if embeddings is None:
                self.model.mtp_hidden(hidden[:t], next_ids, batch, memory)
            else:
                self.model.mtp_hidden(hidden[:t], next_ids, batch, memory, embeddings[:t])
            state.mtp_length = start + t
        if rows > t:
            kept[state.slot, 0] = hidden[t]
            state.draft_carry = []

    def speculate(
        self,
        states: Sequence[SequenceState],
        pending: Sequence[int],
        draft_tokens: int,
        *,
        optimized_head: bool = True,
    ) -> Proposal:
        """One draft-and-verify pass for every lane, as one compiled step: the MTP block
        writes the entries of the last round's accepted tokens and drafts ``draft_tokens``
        tokens after each lane's ``pending`` token (its most likely token each time), then
        the main model reads pending + drafts, K+1 rows per lane, without changing any
        recurrent state. ``commit`` makes the accepted part permanent. ``optimized_head``:
        the drafter scores only the proposal head's rows when the artifact has one
        (verification always uses the full head)."""
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
            self._check_ids(np.asarray(row), f"lane {i}")
            carry[i, : len(row)], carry[i, len(row) :], last[i] = row, row[-1], len(row) - 1
        slots = np.asarray([s.slot for s in states], dtype=np.int32)
        lengths = np.asarray([s.length for s in states], dtype=np.int32)
        starts = np.asarray([s.mtp_length for s in states], dtype=np.int32)
        inputs = [slots, lengths, starts, last, carry]
        deltas = np.asarray([s.rope_delta for s in states], dtype=np.int32)
        shifted = bool(deltas.any())  # a lane after a prompt with images: RoPE at index + delta
        if shifted:  # a step of its own, as for decoding, so text-only rounds are unchanged
            inputs.append(deltas)
        step = self.steps.get(
            pool,
            ("speculate_shifted" if shifted else "speculate", n, t, optimized_head),
            lambda *inputs: speculate_rows(self.model, pool, t, optimized_head, *inputs),
            [(n,), (n,), (n,), (n,), (n, t)] + [(n,)] * shifted,
        )
        tokens, logits = step(*inputs)
        tokens = to_numpy(tokens)  # the round's one host synchronisation
        return Proposal(tokens[:, :draft_tokens], tokens[:, draft_tokens:], logits)

    def commit(self, states: Sequence[SequenceState], accepted: Sequence[Sequence[int]]) -> None:
        """After ``speculate``: lane i consumed its pending token and the drafts verification
        kept, ``accepted[i]`` (a prefix of its drafts); their recurrent states are folded in
        exactly and the rest of the round is dropped (its K/V rows lie past the length)."""
        if len(accepted) != len(states) or not states:
            raise EngineError(f"commit got {len(accepted)} accepted lists for {len(states)} lanes")
        pool, n = states[0].pool, len(states)
        counts = np.asarray([len(a) + 1 for a in accepted], dtype=np.int32)

        def fold(slots: Array, counts: Array) -> tuple[()]:
            self.model.commit(pool, slots, counts)
            return ()  # a step with no outputs

        step = self.steps.get(pool, ("commit", n), fold, [(n,), (n,)])
        step(np.asarray([s.slot for s in states], dtype=np.int32), counts)
        for s, kept in zip(states, accepted, strict=True):
            s.mtp_length = s.length
            s.length += len(kept) + 1
            s.draft_carry = [int(t) for t in kept]

    def _check_ids(self, ids: np.ndarray, where: str) -> None:
        check_ids(ids, self.model.config.vocab, where)
