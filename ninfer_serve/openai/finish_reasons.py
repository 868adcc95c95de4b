"""How a choice ended, as Chat and legacy Completions say it: OpenAI's ``finish_reason`` and
vLLM's ``stop_reason`` (the stop string or stop token id that ended the output)."""

from __future__ import annotations

from ..generation import Outcome

__all__ = ["chat_finish_reason", "completion_finish_reason", "stop_reason"]


def chat_finish_reason(outcome: Outcome) -> str:
    """A Chat choice's ``finish_reason``; OpenAI has no ``cancelled``, so that reads ``stop``."""
    return "stop" if outcome.finish_reason == "cancelled" else outcome.finish_reason


def completion_finish_reason(outcome: Outcome, generates: bool) -> str:
    """A legacy Completions choice's ``finish_reason``: only ``stop`` or ``length``; a request
    that generates nothing (``max_tokens: 0``) ends for its length."""
    if not generates:
        return "length"
    return "length" if outcome.finish_reason == "length" else "stop"


def stop_reason(outcome: Outcome) -> int | str | None:
    """vLLM's ``stop_reason``: the stop string or stop token id that ended the output."""
    return outcome.stop_value if outcome.stop_kind in ("stop_string", "stop_token") else None
