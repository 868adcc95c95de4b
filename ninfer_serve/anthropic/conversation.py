"""Anthropic messages' content blocks as chat-template messages.

``tool_use`` blocks become assistant tool calls, ``tool_result`` blocks tool messages (placed
before the user message that carries the rest of the turn's blocks), ``thinking`` blocks the
assistant's reasoning. Blocks are checked one by one so that an error names
``messages[2].content[1]``.
"""

from __future__ import annotations

from typing import Any

from ..errors import ApiError, invalid_request, shown
from .content import Content, image_block

__all__ = ["assistant_message", "user_messages"]


def _tool_result(content: Any, where: str, is_error: bool) -> str | list[dict[str, Any]]:
    """A tool_result's content (a string, or text and image blocks) as chat content; an
    error's text starts with ``Error: ``."""
    if content is None:
        content = ""
    if isinstance(content, str):
        return f"Error: {content}" if is_error else content
    if not isinstance(content, list):
        raise invalid_request(f"{where}: content must be a string or a list of blocks", where)
    out = Content()
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            out.text(str(block.get("text", "")))
        elif kind == "image":
            out.image(image_block(block, f"{where}[{j}]"))
        else:
            raise invalid_request(
                f"{where}[{j}]: block type {shown(kind)} is not supported in tool results "
                "(text and image)",
                f"{where}[{j}]",
            )
    value = out.value()
    if not is_error:
        return value
    if isinstance(value, str):
        return f"Error: {value}"
    return [{"type": "text", "text": "Error: "}, *value]


def _string(block: dict[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise invalid_request(f"{where}.{key} must be a string", f"{where}.{key}")
    return value


def user_messages(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    content = Content()
    for j, block in enumerate(blocks):
        here = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            content.text(_string(block, "text", here))
        elif kind == "image":
            content.image(image_block(block, here))
        elif kind == "tool_result":
            result = _tool_result(block.get("content"), f"{here}.content", block.get("is_error"))
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": _string(block, "tool_use_id", here),
                    "content": result,
                }
            )
        elif kind in ("document", "search_result", "container_upload"):
            raise ApiError(
                400,
                f"{here}: {kind} blocks are not supported; this server takes text and images",
                code="unsupported_content",
                param=f"{here}.type",
            )
        else:
            raise invalid_request(
                f"{here}: unknown or unsupported block type {shown(kind)}", f"{here}.type"
            )
    if content:
        out.append({"role": "user", "content": content.value()})
    return out


def assistant_message(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    for j, block in enumerate(blocks):
        here = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            message["content"] += _string(block, "text", here)
        elif kind == "thinking":
            message["reasoning_content"] = (message.get("reasoning_content") or "") + _string(
                block, "thinking", here
            )
        elif kind == "redacted_thinking":
            continue  # opaque to us; nothing to render
        elif kind == "tool_use":
            arguments = block.get("input")
            if not isinstance(arguments, dict):
                raise invalid_request(f"{here}.input must be an object", f"{here}.input")
            message.setdefault("tool_calls", []).append(
                {
                    "id": _string(block, "id", here),
                    "type": "function",
                    "function": {"name": _string(block, "name", here), "arguments": arguments},
                }
            )
        else:
            raise invalid_request(
                f"{here}: unknown or unsupported block type {shown(kind)}", f"{here}.type"
            )
    if not message["content"] and message.get("tool_calls"):
        message["content"] = None
    return message
