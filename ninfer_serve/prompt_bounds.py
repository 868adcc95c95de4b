"""Bounds on a prompt's size, from its text alone, before it is rendered and tokenized.

No token is longer than the vocabulary's longest, so a prompt whose text needs more tokens than
the context holds, even at that length each, is refused at once instead of after tokenizing it
all (the tokenizer holds the GIL, so a huge prompt would stall every other request meanwhile).
"""

from __future__ import annotations

from typing import Any

from ninfer_runtime.errors import RequestError

__all__ = [
    "NORMALIZATION_SHRINK",
    "VERBATIM_ROLES",
    "context_exceeded",
    "tool_bytes",
    "verbatim_bytes",
]

#: roles whose content a chat template writes into the prompt verbatim (an assistant turn's
#: reasoning may be dropped from history, so assistant text is not counted)
VERBATIM_ROLES = frozenset({"system", "developer", "user", "tool"})
#: how much Unicode normalization can shrink UTF-8 text (NFC composing three Hangul jamo
#: into one syllable: 9 bytes to 3), so the bound holds for normalizing tokenizers too
NORMALIZATION_SHRINK = 3


def verbatim_bytes(messages: list[dict[str, Any]]) -> int:
    """UTF-8 bytes of the message text the template renders as given."""
    total = 0
    for message in messages:
        if message.get("role") not in VERBATIM_ROLES:
            continue
        content = message.get("content")
        parts = content if isinstance(content, list) else [content]
        for part in parts:
            text = part.get("text") if isinstance(part, dict) else part
            if isinstance(text, str):
                total += len(text.encode("utf-8"))
    return total


def tool_bytes(tools: list[dict[str, Any]] | None) -> int:
    """UTF-8 bytes of the strings (names, descriptions, schema keys and values) in tool
    definitions: a template writes each tool as JSON, which holds them all, escaped (never
    shorter). Walked without recursion: a parameter schema may nest a thousand levels."""
    total = 0
    stack: list[Any] = list(tools or [])
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            total += len(node.encode("utf-8"))
        elif isinstance(node, dict):
            stack.extend(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return total


def context_exceeded(limit: int, tokens: str, param: str) -> RequestError:
    """The 400 for a prompt of ``tokens`` tokens (a count, or a bound on one) that leaves no
    room for a generated token in a context of ``limit``, blaming ``param``."""
    return RequestError(
        f"This model's maximum context length is {limit} tokens. However, your prompt has "
        f"{tokens} tokens (prompt plus at least one generated token must fit). Please shorten "
        f"the {param}.",
        param=param,
        code="context_length_exceeded",
    )
