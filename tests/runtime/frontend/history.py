"""A parsed output as the assistant message a client sends back in the next turn's history."""

from __future__ import annotations

from typing import Any

from ninfer_runtime.frontend.parsers import ParsedOutput


def assistant_message(parsed: ParsedOutput) -> dict[str, Any]:
    """The OpenAI-style assistant message of ``parsed``: reasoning, text and calls."""
    return {
        "role": "assistant",
        "reasoning_content": parsed.reasoning,
        "content": parsed.content,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in parsed.tool_calls
        ],
    }
