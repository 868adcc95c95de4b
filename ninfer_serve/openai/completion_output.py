"""Legacy Completions choices from their runs: the text (the echoed prompt first), the
``logprobs`` in the legacy shape, the finish and stop reasons, and the usage of a request."""

from __future__ import annotations

from typing import Any

from ..generation import Outcome, Run
from .completion_batch import CompletionBatch
from .completion_request import CompletionRequest, Prompt
from .finish_reasons import completion_finish_reason, stop_reason
from .logprobs import Scored, completion_logprobs, prompt_scored, scored

__all__ = ["ChoiceShaper"]


class ChoiceShaper:
    """Builds one request's choices, chunks and usage from its runs."""

    def __init__(self, body: CompletionRequest, tokenizer: Any, prompts: list[Prompt]):
        self.echo = bool(body.echo)
        self.logprobs = body.logprobs
        self.generates = body.max_tokens != 0
        self.n = body.n
        self.tokenizer = tokenizer
        self.prompts = prompts

    def logprobs_of(self, items: list[Scored], text_offset: int) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        shaped = completion_logprobs(self.tokenizer, items, text_offset)
        # as OpenAI's: the chosen token is among its position's alternatives (logprobs + 1
        # of them at most)
        for token, value, top in zip(
            shaped["tokens"], shaped["token_logprobs"], shaped["top_logprobs"], strict=True
        ):
            if top is not None:
                top.setdefault(token, value)
        return shaped

    def echoed(self, batch: CompletionBatch, p: int) -> list[Scored]:
        """The prompt's scored tokens for an echo with logprobs (its first sample's)."""
        if not (self.echo and self.logprobs is not None):
            return []
        scores = batch.run(p, 0).prompt_logprobs
        assert scores is not None
        return prompt_scored(scores)

    def generated(self, run: Run, start: int = 0, end: int | None = None) -> list[Scored]:
        return scored(run.tokens[start:end]) if self.generates else []

    def choice(self, batch: CompletionBatch, p: int, sample: int) -> dict[str, Any]:
        run = batch.run(p, sample)
        outcome = run.outcome
        assert outcome is not None
        text = self.prompts[p].text if self.echo else ""
        if self.generates:
            text += outcome.output.content
        return {
            "index": p * self.n + sample,
            "text": text,
            "logprobs": self.logprobs_of(self.echoed(batch, p) + self.generated(run), 0),
            "finish_reason": self.finish(outcome),
            "stop_reason": stop_reason(outcome) if self.generates else None,
        }

    def finish(self, outcome: Outcome) -> str:
        return completion_finish_reason(outcome, self.generates)

    def usage(self, batch: CompletionBatch) -> dict[str, Any]:
        """Each prompt once (the cache held ``cached_tokens`` of them before the request:
        its first samples'), the generated tokens of every choice."""
        prompt_tokens = sum(len(p.ids) for p in self.prompts)
        completion = cached = 0
        for p in range(len(self.prompts)):
            for sample in range(self.n):
                outcome = batch.run(p, sample).outcome
                assert outcome is not None
                completion += outcome.completion_tokens if self.generates else 0
                cached += outcome.cached_tokens if sample == 0 else 0
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
