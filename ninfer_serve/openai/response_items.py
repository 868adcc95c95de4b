"""Responses input items as chat messages, and a response's output as the assistant message
the next turn continues (the conversation ``previous_response_id`` stores).

Assistant items in a row (text, reasoning, function calls) fold into one assistant message, as
a chat template expects; a reasoning item starts the next assistant message.
"""

from __future__ import annotations

from typing import Any

from ..errors import ApiError, invalid_request, shown
from .content import input_image

__all__ = ["input_messages", "output_messages"]

_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def _text_of(content: Any, where: str) -> str:
    content = _content_of(content, where, images=False)
    assert isinstance(content, str)
    return content


def _content_of(content: Any, where: str, *, images: bool = True) -> str | list[dict[str, Any]]:
    """The chat content for input content: its text joined, or with ``input_image`` parts
    (where ``images`` are taken) text and image parts in order."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid_request(f"{where} must be a string or a list of content parts", where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image" and images:
            parts.append(input_image(part, f"{where}[{j}]"))
            continue
        if kind not in _TEXT_PARTS:
            taken = "text" + (" and input_image" if images else "")
            raise ApiError(
                400,
                f"{where}[{j}]: content part type {shown(kind)} is not supported here "
                f"({taken} parts)",
                code="unsupported_content",
                param=f"{where}[{j}].type",
            )
        text = part.get("text", part.get("refusal"))
        if not isinstance(text, str):
            raise invalid_request(f"{where}[{j}].text must be a string", f"{where}[{j}].text")
        parts.append({"type": "text", "text": text})
    if any(p["type"] == "image" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise invalid_request(f"{where}.{key} must be a string", f"{where}.{key}")
    return value


def _part_texts(item: dict[str, Any], key: str, where: str) -> str:
    """The joined ``text`` of a reasoning item's ``content`` or ``summary`` parts."""
    parts = item.get(key) or []
    if not isinstance(parts, list):
        raise invalid_request(f"{where}.{key} must be a list of parts", f"{where}.{key}")
    texts = []
    for j, part in enumerate(parts):
        text = part.get("text") if isinstance(part, dict) else None
        if not isinstance(text, str):
            here = f"{where}.{key}[{j}]"
            raise invalid_request(f"{here} must be an object with a string text", here)
        texts.append(text)
    return "".join(texts)


def input_messages(items: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Chat messages for Responses input items (string input is one user message)."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    reasoning: str | None = None

    def assistant() -> dict[str, Any]:
        """The assistant message the next output item belongs to (a new one if needed)."""
        nonlocal reasoning
        last = out[-1] if out else None
        if last is None or last["role"] != "assistant" or (reasoning is not None):
            last = {"role": "assistant", "content": ""}
            if reasoning is not None:
                last["reasoning_content"] = reasoning
                reasoning = None
            out.append(last)
        return last

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid_request(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ApiError(
                    400,
                    f"{where}.role must be user, assistant, system or developer",
                    param=f"{where}.role",
                    code="invalid_value",
                )
            if role == "assistant":
                message = assistant()
                text = _text_of(item.get("content"), f"{where}.content")
                message["content"] = (message.get("content") or "") + text
            else:
                here = f"{where}.content"
                content = _content_of(item.get("content"), here, images=role == "user")
                out.append({"role": role, "content": content})
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _string(item, "name", where),
                    "arguments": _string(item, "arguments", where),
                },
            }
            assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = _content_of(item.get("output"), f"{where}.output")
            out.append(
                {"role": "tool", "tool_call_id": _string(item, "call_id", where), "content": output}
            )
        elif kind == "reasoning":
            content, summary = (_part_texts(item, key, where) for key in ("content", "summary"))
            reasoning = (reasoning or "") + (content or summary)
        else:
            raise ApiError(
                400,
                f"{where}.type {shown(kind)} is not supported (message, function_call, "
                "function_call_output, reasoning)",
                param=f"{where}.type",
                code="unsupported_value",
            )
    for message in out:
        if message["role"] == "assistant" and not message.get("content"):
            message["content"] = None if message.get("tool_calls") else ""
    return out


def output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """This response's output items as the assistant message the next turn continues."""
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    for item in output:
        if item["type"] == "reasoning":
            message["reasoning_content"] = "".join(p["text"] for p in item["content"])
        elif item["type"] == "message":
            message["content"] += "".join(p["text"] for p in item["content"])
        elif item["type"] == "function_call":
            message.setdefault("tool_calls", []).append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]},
                }
            )
    return [message]
