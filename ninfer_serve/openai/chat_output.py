"""The collected reply of Chat Completions: a choice per sample (its message, finish and
stop reasons, its ``logprobs`` when asked for) and the usage of them all."""

from __future__ import annotations

from typing import Any

from ..generation import Outcome
from ..samples import combined
from .finish_reasons import chat_finish_reason, stop_reason

__all__ = ["completion_body", "usage_block"]


def usage_block(outcome: Outcome) -> dict[str, Any]:
    """Chat's ``usage`` for an outcome (a reply's: its choices' ``combined``)."""
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": outcome.total_tokens,
        "prompt_tokens_details": {"cached_tokens": outcome.cached_tokens},
        "completion_tokens_details": {
            "reasoning_tokens": outcome.reasoning_tokens,
            "accepted_prediction_tokens": outcome.accepted_draft_tokens,
            "rejected_prediction_tokens": outcome.rejected_draft_tokens,
        },
    }


def _message(outcome: Outcome) -> dict[str, Any]:
    out = outcome.output
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in out.tool_calls
    ]
    return {
        "role": "assistant",
        "content": out.content if (out.content or not calls) else None,
        "reasoning_content": out.reasoning or None,
        "tool_calls": calls,
    }


def completion_body(
    cid: str,
    model: str,
    created: int,
    outcomes: list[Outcome],
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The reply: a choice per sample, with its ``logprobs`` object when asked for."""
    choices = [
        {
            "index": i,
            "message": _message(outcome),
            "logprobs": logprobs[i] if logprobs is not None else None,
            "finish_reason": chat_finish_reason(outcome),
            "stop_reason": stop_reason(outcome),
        }
        for i, outcome in enumerate(outcomes)
    ]
    total = combined(outcomes)
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage_block(total),
        "timings": total.timings(),
    }
