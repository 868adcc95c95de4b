"""Reading a tool call written as JSON (``{"name": ..., "arguments": {...}}``)."""

from __future__ import annotations

import json
from typing import Any


def _read_json_call(body: str) -> tuple[str, str, dict[str, Any]]:
    """(problem, name, arguments) of a JSON-form call; ``problem`` is empty when it is valid."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        return f"tool call JSON is invalid ({exc.msg} at {exc.pos})", "", {}
    if not isinstance(value, dict):
        return "tool call JSON is not an object", "", {}
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return "tool call JSON has no function name", "", {}
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return "tool call arguments string is not valid JSON", "", {}
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return "tool call arguments are not a JSON object", "", {}
    return "", name, arguments
