"""A prompt's log-probabilities (``SamplingParams.prompt_logprobs``), chunk by chunk.

A lane that asks for them reads its prompt alone, with every row's logits
(``Scheduler.prefill_reads``); each chunk scores the prompt tokens its rows predict
(``score_chunk``), and once the prompt is read the scores leave as one ``PromptLogprobs``
event, before the first generated token (``prompt_logprobs``).
"""

from __future__ import annotations

from typing import Any

from .logprobs import token_logprobs
from .request import PromptLogprobs
from .scheduler import Lane


def score_chunk(a: Lane, start: int, end: int, rows: Any) -> None:
    """Scores of the prompt tokens the chunk ``start:end`` predicts: its row i (logits
    [end - start, V]) predicts token ``start + i + 1``; the chunk's last row the next
    chunk's first token, when there is one."""
    targets = a.prompt_ids[start + 1 : end + 1].tolist()
    if targets and a.prompt_scores is not None:
        k = a.request.sampling.prompt_logprobs or 0
        scores = token_logprobs(rows[: len(targets)], targets, [k] * len(targets))
        a.prompt_scores[start + 1 : start + 1 + len(targets)] = scores


def prompt_logprobs(a: Lane) -> PromptLogprobs:
    """The prompt's scores as one event; the prompt is scored once (read again after a
    preemption, it is not scored again)."""
    scores = a.prompt_scores or []
    a.prompt_scores = None
    return PromptLogprobs(
        a.request.request_id,
        tuple(int(t) for t in a.prompt_ids),
        tuple(None if s is None else s.logprob for s in scores),
        tuple(None if s is None else s.top for s in scores),
    )
