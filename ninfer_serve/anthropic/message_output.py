"""An Anthropic message's parts, built from a finished generation: the collected message body,
and the pieces the streamed one shares with it (block ids, signatures, stop reason, usage).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..generation import Outcome

__all__ = ["message_body", "stop_reason", "thinking_signature", "tool_use_id", "usage"]


def thinking_signature(thinking: str) -> str:
    """An opaque signature for a thinking block (clients echo it back; we do not check it)."""
    return "ninfer-" + hashlib.sha256(thinking.encode()).hexdigest()[:32]


def tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(outcome: Outcome) -> tuple[str, str | None]:
    if outcome.finish_reason == "tool_calls":
        return "tool_use", None
    if outcome.finish_reason == "length":
        if outcome.context_exhausted:
            return "model_context_window_exceeded", None
        return "max_tokens", None
    if outcome.stop_kind == "stop_string":
        return "stop_sequence", str(outcome.stop_value)
    return "end_turn", None


def usage(outcome: Outcome | None, prompt_tokens: int) -> dict[str, Any]:
    """Anthropic's split of the prompt: read from the cache, and the rest. Caching is
    automatic (``cache_control`` is accepted, not needed), so nothing counts as a paid
    cache write: ``cache_creation_input_tokens`` is 0 and the three add up to the prompt."""
    cached = outcome.cached_tokens if outcome else 0
    return {
        "input_tokens": prompt_tokens - cached,
        "output_tokens": outcome.completion_tokens if outcome else 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def message_body(mid: str, model: str, outcome: Outcome) -> dict[str, Any]:
    out = outcome.output
    content: list[dict[str, Any]] = []
    if out.reasoning:
        content.append(
            {
                "type": "thinking",
                "thinking": out.reasoning,
                "signature": thinking_signature(out.reasoning),
            }
        )
    if out.content:
        content.append({"type": "text", "text": out.content})
    for call in out.tool_calls:
        content.append(
            {
                "type": "tool_use",
                "id": tool_use_id(call.id),
                "name": call.name,
                "input": json.loads(call.arguments or "{}"),
            }
        )
    reason, sequence = stop_reason(outcome)
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(outcome, outcome.prompt_tokens),
    }
