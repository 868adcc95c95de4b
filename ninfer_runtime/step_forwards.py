"""An engine step's forwards outside speculative rounds: the prefill chunk, the first tokens
of the prompts it ends, and the plain decode step.

``Engine.step`` decides what each step runs; ``StepForwards`` runs it. ``prefill`` reads every
lane's share of the chunk in one forward (scoring prompt tokens, writing the drafter's entries
and keeping checkpoints on the way); ``prompts_done`` samples the first tokens of the lanes
whose prompts are in, together; ``decode`` feeds each generating lane its pending token (or,
after a preemption, the next one it replays). A round of speculative decoding is
``speculative_round``'s.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .events import EventWriter
from .images import placed_inputs
from .lane_checkpoints import MarkCapture, save_captures
from .models import ForwardOutput
from .models.batch import Mark
from .prompt_logprobs import prompt_logprobs, score_chunk
from .request import Event
from .runner import ModelRunner
from .scheduler import Lane, Read, Scheduler
from .speculative import SpecConfig
from .state import ContextPool
from .token_choice import TokenChooser


class StepForwards:
    """The prefill and decode forwards of one engine: its ``model`` on its ``runner`` over its
    ``pool``, the lanes the ``scheduler`` holds; each lane's tokens chosen by ``token_choice``
    and emitted by ``event_writer``; with ``spec``, the drafter's entries written as well."""

    def __init__(
        self,
        spec: SpecConfig | None,
        *,
        model: Any,
        runner: ModelRunner,
        pool: ContextPool,
        scheduler: Scheduler,
        token_choice: TokenChooser,
        event_writer: EventWriter,
    ):
        self.spec = spec
        self.model = model
        self.runner = runner
        self.pool = pool
        self.scheduler = scheduler
        self.token_choice = token_choice
        self.event_writer = event_writer

    def prefill(self, reads: list[Read], events: list[Event]) -> None:
        """Run this step's prefill chunk (``Scheduler.prefill_reads``): one forward for
        every lane's read; the lanes whose prompts it ends sample their first tokens."""
        scoring = reads[0][0].prompt_scores is not None
        embeddings = positions = None
        if any(a.images is not None for a, _, _ in reads):
            embeddings, positions = placed_inputs(
                self.model, [(a.prompt_ids, a.images, start, end) for a, start, end in reads]
            )
        captures, marks = self._marks(reads)
        try:
            out = self.runner.forward(
                [a.prompt_ids[start:end] for a, start, end in reads],
                [a.state for a, _, _ in reads],
                last_only=not scoring,
                embeddings=embeddings,
                positions=positions,
                marks=marks,
            )
        except BaseException:
            for c in captures:
                self.pool.release_snapshot(c.snapshot)
            raise
        if captures:  # the checkpoints kept inside the reads
            hidden = {id(a): (out.hidden[i], start) for i, (a, start, _) in enumerate(reads)}
            self.scheduler.checkpoints.keep_marks(captures, hidden)
        done = [
            i
            for i, (a, start, end) in enumerate(reads)
            if self._prefilled(a, start, end, out.logits[i], out.hidden[i], events)
        ]
        if done:  # their first tokens, sampled together
            whole = len(done) == len(reads) and out.last_logits is not None
            self.prompts_done(
                [reads[i][0] for i in done],
                ForwardOutput(
                    [out.logits[i] for i in done],
                    [out.hidden[i] for i in done],
                    out.last_logits if whole else None,
                ),
                events,
            )

    def _marks(self, reads: list[Read]) -> tuple[list[MarkCapture], list[list[Mark]] | None]:
        """The checkpoints kept inside this step's reads (a model that keeps them there:
        ``LaneCheckpoints.marks``), and each read's ``Mark``s for the forward (None: none)."""
        if not self.scheduler.checkpoints_inside_reads:
            return [], None
        per_read = [self.scheduler.checkpoints.marks(a, start, end) for a, start, end in reads]
        if not any(per_read):
            return [], None
        marks = [
            [Mark(c.position - start, c, save_captures) for c in lane]
            for lane, (_, start, _) in zip(per_read, reads, strict=True)
        ]
        return [c for lane in per_read for c in lane], marks

    def _prefilled(
        self, a: Lane, start: int, end: int, logits: Any, hidden: Any, events: list[Event]
    ) -> bool:
        """Lane ``a`` has read ``start:end`` of its prompt (``logits``: its rows', or only
        the last row's; ``hidden``: its rows'): scores, the drafter's entries and a
        checkpoint where one goes. True: that was the prompt's end."""
        scoring = a.prompt_scores is not None
        if scoring:
            score_chunk(a, start, end, logits)
        if self.spec is not None:  # the drafter reads the prompt too, images placed
            rows = at = None
            if a.images is not None:
                span = [(a.prompt_ids, a.images, start + 1, end + 1)]
                rows, at = placed_inputs(self.model, span)
            self.runner.mtp_prefill(hidden, a.prompt_ids[start + 1 : end + 1], a.state, at, rows)
        last = hidden[-1] if self.spec is not None else None
        if not self.scheduler.prefilled(a, end, last, logits):
            return False
        if scoring:
            events.append(prompt_logprobs(a))
        return True

    def prompts_done(
        self, lanes: list[Lane], out: ForwardOutput | None, events: list[Event]
    ) -> None:
        """The lanes' prompts are in: each one's first token from its last logits (``out``,
        lane by lane), or for a preempted lane the first token to replay."""
        fresh = [i for i, a in enumerate(lanes) if not a.generated]
        for a in lanes:
            if a.generated:
                a.pending = a.replay.pop(0)
        if not fresh:
            return
        assert out is not None
        if len(fresh) < len(lanes):
            out = ForwardOutput([out.logits[i] for i in fresh], [out.hidden[i] for i in fresh])
        now = time.perf_counter()
        for i in fresh:
            lanes[i].first_token = now
        for lane, token, score in self.token_choice.choose([lanes[i] for i in fresh], out, events):
            self.event_writer.emit(lane, token, events, score)

    def decode(self, lanes: list[Lane], events: list[Event]) -> None:
        tokens = [np.asarray([a.pending], dtype=np.int64) for a in lanes]
        out = self.runner.forward(tokens, [a.state for a in lanes], last_only=True)
        if self.spec is not None:  # replaying: the drafter's entries follow the tokens
            xp, kept = self.model.backend.xp, self.pool.draft_hidden
            for a, fed, hidden in zip(lanes, tokens, out.hidden, strict=True):
                rows = xp.concatenate([kept[a.state.slot, :1], hidden[-1:]])
                self.runner.mtp_prefill(rows, fed, a.state)
        generating = [i for i, a in enumerate(lanes) if not a.replay]
        for a in lanes:
            if a.replay:  # replaying after a preemption: the next token is known
                a.pending = a.replay.pop(0)
        if len(generating) < len(lanes):
            out = ForwardOutput(
                [out.logits[i] for i in generating], [out.hidden[i] for i in generating]
            )
        for a, token, score in self.token_choice.choose(
            [lanes[i] for i in generating], out, events
        ):
            self.event_writer.emit(a, token, events, score)
