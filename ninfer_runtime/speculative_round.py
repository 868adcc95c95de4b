"""One speculative round of an engine step: every generating lane drafts, verifies, keeps.

``SpeculativeRounds.run`` asks the runner for one round (``ModelRunner.speculate``: the MTP
block drafts K tokens per lane, one batched forward verifies them), then each lane keeps its
tokens by the acceptance rules of ``speculative`` (``accept``) and emits them; the lanes still
generating commit what they kept. A lane whose next tokens the engine itself constrains (a
logits processor, stop tokens held back by ``min_tokens``, a thinking budget closing within
the round) keeps only the main model's first token, chosen as a plain step chooses it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .backends.base import to_numpy
from .errors import EngineError
from .events import EventWriter
from .logprobs import TokenLogprobs, token_logprobs
from .models import ForwardOutput
from .request import Event
from .runner import ModelRunner
from .scheduler import Lane, Scheduler
from .speculative import SpecConfig, SpecStats, accept_greedy, accept_sampled
from .token_choice import TokenChooser


def check_drafter(artifact: Any, model: Any, spec: SpecConfig) -> None:
    """One line when ``model`` cannot draft for ``spec`` (no MTP block run or stored)."""
    if model.has_mtp:
        return
    if "mtp" in artifact.components:  # stored, but this model does not run it
        raise EngineError(
            f"{artifact.path}: speculative method {spec.method!r} is not built "
            f"for {type(model).__name__} yet; its mtp component is not run"
        )
    raise EngineError(
        f"{artifact.path}: the artifact has no mtp component; speculative "
        f"method {spec.method!r} needs one (convert with --components text,mtp)"
    )


class SpeculativeRounds:
    """The rounds of one engine: ``spec``'s drafts on its ``runner``, counted in ``stats``;
    the lanes' tokens chosen by ``token_choice`` and emitted by ``event_writer``."""

    def __init__(
        self,
        spec: SpecConfig,
        stats: SpecStats,
        *,
        model: Any,
        runner: ModelRunner,
        scheduler: Scheduler,
        token_choice: TokenChooser,
        event_writer: EventWriter,
    ):
        self.spec = spec
        self.stats = stats
        self.model = model
        self.runner = runner
        self.scheduler = scheduler
        self.token_choice = token_choice
        self.event_writer = event_writer

    def run(self, lanes: list[Lane], events: list[Event]) -> None:
        """One speculative round for every generating lane. A lane whose next tokens the
        engine constrains (a logits processor, a thinking budget closing within the round)
        keeps only the main model's first token, sampled as in a plain step."""
        k = self.spec.draft_tokens
        # a lane ending in this round keeps a checkpoint with it
        if self.scheduler.cache is not None:
            xp = self.model.backend.xp
            rows = self.scheduler.pool.draft_hidden[
                xp.asarray([a.state.slot for a in lanes]),
                xp.asarray([len(a.state.draft_carry) for a in lanes]),
            ]
            for a, row in zip(lanes, rows, strict=True):
                a.last_hidden = row
        proposal = self.runner.speculate(
            [a.state for a in lanes],
            [a.pending for a in lanes],
            k,
            optimized_head=self.spec.proposal_head == "optimized",
        )
        kept: dict[str, list[int]] = {}
        for i, a in enumerate(lanes):
            rows = slice(i * (k + 1), (i + 1) * (k + 1))
            if not self._may_speculate(a, k):
                first = ForwardOutput([proposal.logits[rows.start : rows.start + 1]], [None])
                sampled = self.token_choice.choose([a], first, events)
                tokens, scores = [t for _, t, _ in sampled], [s for _, _, s in sampled]
                drafts: list[int] = []
                self.stats.fallbacks += 1
            else:
                try:
                    tokens, scores = accept(
                        a, proposal.drafts[i], proposal.targets[i], proposal.logits[rows]
                    )
                except Exception as exc:  # this request's parameters, not the engine's
                    self.event_writer.fail(a, exc, events)
                    continue
                drafts = tokens[:-1]
                a.drafted += k
                a.accepted += len(drafts)
                self.stats.record(len(drafts))
            for token, score in zip(tokens, scores, strict=True):
                self.event_writer.emit(a, token, events, score)
                if a.pending is None:  # the request ended inside the round
                    break
            kept[a.request.request_id] = drafts
        # lanes still generating commit what they kept (the others have been released)
        survivors = [a for a in lanes if self.scheduler.active.get(a.request.request_id) is a]
        if survivors:
            self.runner.commit(
                [a.state for a in survivors], [kept[a.request.request_id] for a in survivors]
            )

    def _may_speculate(self, a: Lane, k: int) -> bool:
        if a.request.logits_processor is not None or self.token_choice.held_stops(a):
            return False  # a draft could be a stop token min_tokens forbids yet
        if a.answer_start is not None or a.thinking_budget is None:
            return True
        forced_from = a.thinking_budget - len(self.token_choice.tokenizer.think_close_ids)
        return len(a.generated) + k < forced_from


def accept(
    a: Lane, drafts: Any, targets: Any, rows: Any
) -> tuple[list[int], list[TokenLogprobs | None]]:
    """The tokens lane ``a`` keeps from its round (they count for its penalties), and
    with ``logprobs`` their scores: the main model's rows at their positions, penalised
    as plain decoding has them (the kept tokens before each count as generated)."""
    params = a.request.sampling
    plain_greedy = params.greedy and not (
        params.repetition_penalty != 1.0 or params.presence_penalty or params.frequency_penalty
    )
    if plain_greedy:
        tokens = accept_greedy(drafts, targets)
        scored = rows[: len(tokens)]  # no penalties: scored where the rows are
    else:
        scored = to_numpy(rows).astype(np.float32)
        tokens = accept_sampled(a.sampler, drafts, scored)
    scores: list[TokenLogprobs | None] = [None] * len(tokens)
    if params.logprobs is not None:
        if not plain_greedy:
            scored = np.stack(
                [a.sampler.penalized(scored[j], extra=tokens[:j]) for j in range(len(tokens))]
            )
        scores = list(token_logprobs(scored, tokens, [params.logprobs] * len(tokens)))
    a.sampler.accept(tokens)
    return tokens, scores
