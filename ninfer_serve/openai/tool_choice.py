"""The check both OpenAI APIs make of a request's ``tool_choice`` against its ``tools``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ApiError, shown


def check_tool_choice(tool_choice: str, tools: Sequence[Mapping[str, Any]]) -> None:
    """``tool_choice`` ("auto", "none", "required" or a function's name) must be one the
    request's ``tools`` can honour: a named function among them, "required" with some."""
    named = tool_choice not in ("auto", "none", "required")
    if named and tool_choice not in {t["function"]["name"] for t in tools}:
        raise ApiError(
            400,
            f"tool_choice names {shown(tool_choice)}, which is not in tools",
            code="invalid_tool_choice",
            param="tool_choice",
        )
    if tool_choice == "required" and not tools:
        raise ApiError(
            400,
            "tool_choice 'required' needs tools",
            code="invalid_tool_choice",
            param="tool_choice",
        )
