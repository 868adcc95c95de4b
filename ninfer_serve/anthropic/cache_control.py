"""Where an Anthropic request's ``cache_control`` marks fall in the conversation it becomes.

Caching is automatic; a mark only tells the prefix cache where later requests are likely to
branch off, so that it keeps a checkpoint there (``cache_boundaries.py``).
"""

from __future__ import annotations

from ..cache_boundaries import Breakpoint
from .models import CountTokensRequest, MessagesRequest

__all__ = ["cache_breakpoints"]


def cache_breakpoints(
    body: MessagesRequest | CountTokensRequest, starts: list[int]
) -> list[Breakpoint]:
    """The places ``cache_control`` marks, in the conversation ``to_job`` made (message
    ``starts[i]`` is the first one ``messages[i]`` became): after a system block, after the
    tool definitions (the template writes them all in one block, so any marked tool marks
    their end), after a message's block (a tool result: after its tool message)."""
    found: list[Breakpoint] = []
    leading = 1 if body.system else 0
    if isinstance(body.system, list):
        for j, block in enumerate(body.system):
            if block.cache_control is not None:
                last = j == len(body.system) - 1
                offset = len("\n".join(b.text for b in body.system[: j + 1]))
                found.append(Breakpoint(1, None if last else offset))
    if any(tool.cache_control is not None for tool in body.tools or ()):
        found.append(Breakpoint(leading))
    for i, m in enumerate(body.messages):
        if isinstance(m.content, str):
            continue
        if m.role == "assistant":
            if any(isinstance(b, dict) and b.get("cache_control") for b in m.content):
                found.append(Breakpoint(starts[i] + 1))
            continue
        blocks = [b for b in m.content if isinstance(b, dict)]
        results = [b for b in blocks if b.get("type") == "tool_result"]
        content = [b for b in blocks if b.get("type") in ("text", "image")]
        user = starts[i] + len(results) + 1  # the user message comes after the tool ones
        seen_results = seen_content = offset = 0
        after_text = False  # ``user_messages`` joins a text to a text before it with a newline
        for block in blocks:
            kind = block.get("type")
            if kind == "tool_result":
                seen_results += 1
                if block.get("cache_control"):
                    found.append(Breakpoint(starts[i] + seen_results))
                continue
            if kind == "text":
                offset += after_text + len(str(block.get("text") or ""))
            if kind in ("text", "image"):
                seen_content += 1
                after_text = kind == "text"
                if block.get("cache_control"):
                    last = seen_content == len(content)
                    place = None if last else offset
                    past = kind == "image" and not last
                    found.append(Breakpoint(user, place, past_images=past))
    return found
