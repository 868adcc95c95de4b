"""Request checking for chat templates: messages and tools in the shape templates expect.

Messages and tools are checked before rendering so a bad request fails with a ``RequestError``
naming the message and field, never with a Jinja traceback. The inputs are never modified;
checked copies come back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ninfer_runtime.frontend._errors import request_error

__all__ = ["ROLES", "normalize_messages", "normalize_tools"]

ROLES = ("system", "developer", "user", "assistant", "tool")


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Checked copies of ``messages`` in the shape templates expect.

    ``developer`` becomes ``system`` (Qwen has no developer role), the history alias
    ``reasoning`` becomes ``reasoning_content``, and tool-call arguments given as JSON strings
    (the OpenAI wire form) become mappings (the form HF templates iterate). The input is never
    modified.
    """
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise request_error("messages must be a non-empty list of message objects", "messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise request_error(f"{where} must be an object", where)
        msg = dict(message)
        role = msg.get("role")
        if role is None:
            raise request_error(f"{where}.role is missing", f"{where}.role")
        if role not in ROLES:
            raise request_error(
                f"{where}.role {role!r} is not one of {', '.join(ROLES)}", f"{where}.role"
            )
        if role == "developer":
            msg["role"] = "system"
        if "reasoning" in msg and msg.get("reasoning_content") is None:
            msg["reasoning_content"] = msg.pop("reasoning")
        reasoning = msg.get("reasoning_content")
        if reasoning is not None and not isinstance(reasoning, str):
            raise request_error(
                f"{where}.reasoning_content must be a string", f"{where}.reasoning_content"
            )
        content = msg.get("content")
        if content is None:
            if role != "assistant":
                raise request_error(
                    f"{where}.content is missing ({role} messages need content)",
                    f"{where}.content",
                )
            if not msg.get("tool_calls") and reasoning is None:
                raise request_error(
                    f"{where}: an assistant message needs content, reasoning_content or tool_calls",
                    f"{where}.content",
                )
        else:
            _check_content(content, f"{where}.content")
        if role == "assistant" and msg.get("tool_calls") is not None:
            msg["tool_calls"] = _normalize_tool_calls(msg["tool_calls"], f"{where}.tool_calls")
        elif msg.get("tool_calls"):
            raise request_error(
                f"{where}.tool_calls is only allowed on assistant messages", f"{where}.tool_calls"
            )
        out.append(msg)
    return out


def _check_content(content: Any, where: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise request_error(
            f"{where} must be a string or a list of content parts, got {type(content).__name__}",
            where,
        )
    for j, part in enumerate(content):
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise request_error(f"{where}[{j}] must be an object with a type", f"{where}[{j}]")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise request_error(f"{where}[{j}].text must be a string", f"{where}[{j}].text")


def _normalize_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise request_error(f"{where} must be a list", where)
    out = []
    for j, call in enumerate(calls):
        here = f"{where}[{j}]"
        if not isinstance(call, Mapping):
            raise request_error(f"{here} must be an object", here)
        nested = isinstance(call.get("function"), Mapping)
        fn = call["function"] if nested else call
        prefix = f"{here}.function" if nested else here
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise request_error(f"{prefix}.name must be a non-empty string", f"{prefix}.name")
        arguments = fn.get("arguments")
        if arguments is None:
            arguments = {}
        elif isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                raise request_error(
                    f"{prefix}.arguments is not valid JSON ({exc.msg} at {exc.pos})",
                    f"{prefix}.arguments",
                ) from None
        if not isinstance(arguments, Mapping):
            raise request_error(f"{prefix}.arguments must be a JSON object", f"{prefix}.arguments")
        normalized = {k: v for k, v in call.items() if k != "function"}
        normalized.pop("name", None)
        normalized.pop("arguments", None)
        normalized["type"] = "function"
        normalized["function"] = {"name": name, "arguments": dict(arguments)}
        out.append(normalized)
    return out


def normalize_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Checked copies of ``tools`` in the OpenAI shape ``{"type": "function", "function": ...}``.

    A bare function schema (``{"name": ..., "parameters": ...}``, accepted by HF) is wrapped, so
    the prompt lists every tool the same way.
    """
    if tools is None:
        return None
    if isinstance(tools, str | bytes) or not isinstance(tools, Sequence):
        raise request_error("tools must be a list of tool objects", "tools")
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise request_error(f"{where} must be an object", where)
        if "function" in tool:
            if tool.get("type", "function") != "function":
                raise request_error(
                    f"{where}.type {tool.get('type')!r} is not supported (only 'function')",
                    f"{where}.type",
                )
            fn = tool["function"]
            prefix = f"{where}.function"
            if not isinstance(fn, Mapping):
                raise request_error(f"{prefix} must be an object", prefix)
            wrapped = {**tool, "type": "function", "function": dict(fn)}
        else:
            fn, prefix = tool, where
            wrapped = {"type": "function", "function": dict(tool)}
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise request_error(f"{prefix}.name must be a non-empty string", f"{prefix}.name")
        parameters = fn.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise request_error(
                f"{prefix}.parameters must be a JSON schema object", f"{prefix}.parameters"
            )
        out.append(wrapped)
    return out
