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
steps compiled once per shape for one pool), ``speculative_calls`` (the drafter's calls and a
draft-and-verify pass, checked and laid out) and ``speculative_step`` (the device side of a
draft-and-verify pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import forwards, speculative_calls
from .compiled_steps import CompiledSteps
from .errors import EngineError, ModelError
from .lane_plan import check_capacity, plan_lanes
from .models.base import ForwardOutput, Model
from .models.batch import Batch, Lane, Mark
from .speculative_step import Proposal
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

    @property
    def checkpoints_inside_reads(self) -> bool:
        """Whether the model keeps checkpoints inside a prefill read (``batch.Mark``; a
        model says so with ``checkpoints_inside_reads = True``, absent: False)."""
        return bool(getattr(self.model, "checkpoints_inside_reads", False))

    # ----------------------------------------------------------------------- forward
    def forward(
        self,
        tokens_per_lane: Sequence[Array],
        states: Sequence[SequenceState],
        *,
        last_only: bool = False,
        embeddings: Array | None = None,
        positions: np.ndarray | None = None,
        marks: Sequence[Sequence[Mark]] | None = None,
    ) -> ForwardOutput:
        """Advance every lane by its tokens; lanes share projections, not memory. One token
        in every lane is a decode step; the same few tokens in every lane, no more than the
        pool's ``step_rows``, a compiled step of that many rows per lane; anything else, and
        any lane with ``marks`` (checkpoints kept inside its rows: a model whose
        ``checkpoints_inside_reads`` says so), is a chunk.

        A prompt with images (``multimodal``) runs as a chunk with ``embeddings`` (device
        [rows, H]: the layers' input instead of the tokens' embeddings) and ``positions``
        (host [rows] or [3, rows]: the RoPE positions instead of the rows' sequence indices;
        the cache is still written at the sequence indices). Without ``positions`` a row's
        position is its sequence index plus its state's ``rope_delta`` (a sequence after a
        prompt with images)."""
        if marks and any(marks) and not self.checkpoints_inside_reads:
            raise EngineError("this model keeps no checkpoints inside a read")
        lanes, ids = plan_lanes(
            tokens_per_lane,
            states,
            layers=len(self.specs),
            vocab=self.model.config.vocab,
            marks=marks,
        )
        if embeddings is not None or positions is not None or any(lane.marks for lane in lanes):
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
        return speculative_calls.mtp_logits(self, hidden, next_token_ids, state, start=start)

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
        speculative_calls.mtp_prefill(self, hidden, next_ids, state, positions, embeddings)

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
        return speculative_calls.speculate(
            self, states, pending, draft_tokens, optimized_head=optimized_head
        )

    def commit(self, states: Sequence[SequenceState], accepted: Sequence[Sequence[int]]) -> None:
        """After ``speculate``: lane i consumed its pending token and the drafts verification
        kept, ``accepted[i]`` (a prefix of its drafts); their recurrent states are folded in
        exactly and the rest of the round is dropped (its K/V rows lie past the length)."""
        speculative_calls.commit(self, states, accepted)
