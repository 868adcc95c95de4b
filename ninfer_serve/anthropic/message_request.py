"""An Anthropic Messages request (or a count_tokens one) as a generation job.

A final assistant message without tool calls is an assistant prefill: the model continues it.
Without a ``thinking`` field the model does not think (Anthropic's default); ``enabled`` and
``adaptive`` turn the template's thinking on (``budget_tokens`` is checked, not enforced: the
engine has no reasoning budget yet).
"""

from __future__ import annotations

from typing import Any

from ..effort import Effort
from ..errors import ApiError, invalid_request, shown
from ..generation import Job
from ..limits import check_stop_count
from .cache_control import cache_breakpoints
from .conversation import assistant_message, user_messages
from .models import CountTokensRequest, MessagesRequest

__all__ = ["to_job"]


def to_job(body: MessagesRequest | CountTokensRequest) -> Job:
    if body.mcp_servers:
        raise ApiError(
            400,
            "mcp_servers: MCP connectors are not supported",
            code="unsupported_parameter",
            param="mcp_servers",
        )
    messages: list[dict[str, Any]] = []
    if body.system:
        system = (
            body.system if isinstance(body.system, str) else "\n".join(b.text for b in body.system)
        )
        messages.append({"role": "system", "content": system})
    starts: list[int] = []
    for i, m in enumerate(body.messages):
        where = f"messages[{i}].content"
        starts.append(len(messages))
        if isinstance(m.content, str):
            messages.append({"role": m.role, "content": m.content})
        elif m.role == "user":
            messages.extend(user_messages(m.content, where))
        else:
            messages.append(assistant_message(m.content, where))
    last = body.messages[-1]
    prefill = last.role == "assistant" and not messages[-1].get("tool_calls")
    tools = []
    for i, tool in enumerate(body.tools or []):
        if tool.type not in (None, "custom"):
            raise ApiError(
                400,
                f"tools[{i}]: server tool {shown(tool.type)} is not supported",
                code="unsupported_parameter",
                param=f"tools[{i}].type",
            )
        fn: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description:
            fn["description"] = tool.description
        tools.append({"type": "function", "function": fn})
    choice = body.tool_choice
    tool_choice = "auto" if tools else "none"
    parallel = True
    if choice is not None:
        parallel = not choice.disable_parallel_tool_use
        if choice.type == "any":
            tool_choice = "required"
        elif choice.type == "none":
            tool_choice = "none"
        elif choice.type == "tool":
            if not choice.name or choice.name not in {t["function"]["name"] for t in tools}:
                raise invalid_request(
                    f"tool_choice.name {shown(choice.name)} is not in tools", "tool_choice.name"
                )
            tool_choice = choice.name
    if tool_choice == "required" and not tools:
        raise invalid_request("tool_choice 'any' needs tools", "tool_choice")
    thinking, budget = _thinking(body)
    fmt = body.output_format or (body.output_config.format if body.output_config else None)
    sampling: dict[str, Any] = {}
    if isinstance(body, MessagesRequest):
        check_stop_count(body.stop_sequences, "stop_sequences")
        sampling = {
            "max_tokens": body.max_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "top_k": body.top_k,
            "stop": body.stop_sequences or None,
            "max_thinking_tokens": budget,
        }
    return Job(
        messages=messages,
        tools=tools or None,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        json_schema=fmt.schema_ if fmt is not None else None,
        json_schema_param="output_config.format.schema",
        sampling=sampling,
        enable_thinking=thinking,
        reasoning_effort=_effort(body),
        continue_final_message=prefill,
        cache_salt=body.cache_salt if isinstance(body, MessagesRequest) else None,
        cache_breakpoints=cache_breakpoints(body, starts),
    )


def _effort(body: MessagesRequest | CountTokensRequest) -> Effort | None:
    """``output_config.effort``: a template with effort levels of its own (GLM-5) takes it;
    others ignore it (the thinking budget is ``thinking.budget_tokens``)."""
    effort = body.output_config.effort if body.output_config is not None else None
    return Effort(effort, "output_config.effort") if effort is not None else None


def _thinking(body: MessagesRequest | CountTokensRequest) -> tuple[bool, int | None]:
    """(thinking on, its budget): ``enabled`` with ``budget_tokens``, ``adaptive`` without one;
    absent or ``disabled``, the model does not think (as on Anthropic's API)."""
    if body.thinking is None or body.thinking.type == "disabled":
        return False, None
    if body.thinking.type == "adaptive":
        return True, None
    budget = body.thinking.budget_tokens
    if budget is None or budget < 1:
        raise invalid_request(
            "thinking.budget_tokens must be a positive integer", "thinking.budget_tokens"
        )
    max_tokens = body.max_tokens
    if max_tokens is not None and budget >= max_tokens:
        raise invalid_request(
            "thinking.budget_tokens must be less than max_tokens", "thinking.budget_tokens"
        )
    return True, budget
