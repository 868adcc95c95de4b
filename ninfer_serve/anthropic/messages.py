"""POST /v1/messages and /v1/messages/count_tokens: Anthropic Messages on the shared adapter.

Content blocks map onto the chat-template conversation: ``tool_use`` blocks become assistant
tool calls, ``tool_result`` blocks tool messages, ``thinking`` blocks the assistant's reasoning.
A final assistant message without tool calls is an assistant prefill: the model continues it.
Without a ``thinking`` field the model does not think (Anthropic's default); ``enabled`` and
``adaptive`` turn the template's thinking on (``budget_tokens`` is checked, not enforced: the
engine has no reasoning budget yet).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response
from litestar.response import Stream

from ninfer_runtime.frontend import (
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)

from ..cache_boundaries import Breakpoint
from ..cache_isolation import isolate
from ..effort import Effort
from ..errors import ApiError, from_exception, invalid_request, shown
from ..generation import Job, Outcome, Run
from ..http import ServerState, sse_event, sse_response, until_disconnect
from ..limits import check_stop_count
from .content import Content, image_block
from .models import CountTokensRequest, MessagesRequest

__all__ = ["count_tokens", "create_message", "message_body", "to_job"]

_PING = sse_event("ping", {"type": "ping"})


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


def _user(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
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


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
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
            messages.extend(_user(m.content, where))
        else:
            messages.append(_assistant(m.content, where))
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
        cache_breakpoints=_cache_breakpoints(body, starts),
    )


def _cache_breakpoints(
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
        after_text = False  # ``_user`` joins a text to a text before it with a newline
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


# -- output ---------------------------------------------------------------------------------------


def _signature(thinking: str) -> str:
    """An opaque signature for a thinking block (clients echo it back; we do not check it)."""
    return "ninfer-" + hashlib.sha256(thinking.encode()).hexdigest()[:32]


def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _stop(outcome: Outcome) -> tuple[str, str | None]:
    if outcome.finish_reason == "tool_calls":
        return "tool_use", None
    if outcome.finish_reason == "length":
        if outcome.context_exhausted:
            return "model_context_window_exceeded", None
        return "max_tokens", None
    if outcome.stop_kind == "stop_string":
        return "stop_sequence", str(outcome.stop_value)
    return "end_turn", None


def _usage(outcome: Outcome | None, prompt_tokens: int) -> dict[str, Any]:
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
            {"type": "thinking", "thinking": out.reasoning, "signature": _signature(out.reasoning)}
        )
    if out.content:
        content.append({"type": "text", "text": out.content})
    for call in out.tool_calls:
        content.append(
            {
                "type": "tool_use",
                "id": _tool_id(call.id),
                "name": call.name,
                "input": json.loads(call.arguments or "{}"),
            }
        )
    reason, sequence = _stop(outcome)
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": _usage(outcome, outcome.prompt_tokens),
    }


class _Blocks:
    """The content-block lifecycle of a streamed message."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None
        self.text = ""
        self.calls: dict[int, int] = {}  # parser call index -> block index

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        out = []
        if self.kind == "thinking":
            out.append(self._delta({"type": "signature_delta", "signature": _signature(self.text)}))
        out.append(
            sse_event("content_block_stop", {"type": "content_block_stop", "index": self.index})
        )
        self.kind = None
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse_event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self.index, "delta": delta},
        )

    def _open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.kind = kind
        self.text = ""
        out.append(
            sse_event(
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
        )
        return out

    def feed(self, event: Any) -> list[bytes]:
        if isinstance(event, ReasoningDelta):
            out = (
                []
                if self.kind == "thinking"
                else self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            )
            self.text += event.text
            return [*out, self._delta({"type": "thinking_delta", "thinking": event.text})]
        if isinstance(event, TextDelta):
            out = [] if self.kind == "text" else self._open("text", {"type": "text", "text": ""})
            return [*out, self._delta({"type": "text_delta", "text": event.text})]
        if isinstance(event, ToolCallStart):
            out = self._open(
                "tool_use",
                {"type": "tool_use", "id": _tool_id(event.id), "name": event.name, "input": {}},
            )
            self.calls[event.index] = self.index
            return out
        if (
            isinstance(event, ToolCallArgumentsDelta)
            and self.calls.get(event.index) == (self.index)
            and self.kind == "tool_use"
        ):
            return [self._delta({"type": "input_json_delta", "partial_json": event.text})]
        if isinstance(event, ToolCallEnd) and self.calls.get(event.index) == self.index:
            return self.close()
        return []


async def _events(mid: str, model: str, run: Run) -> AsyncIterator[bytes]:
    start = {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": _usage(None, run.prompt_tokens),
    }
    yield sse_event("message_start", {"type": "message_start", "message": start})
    yield _PING
    blocks = _Blocks()
    try:
        async for data in run.frames(blocks.feed, _PING):
            yield data
    except Exception as exc:
        _, body = from_exception(exc).anthropic(None)
        yield sse_event("error", body)
        return
    for data in blocks.close():
        yield data
    outcome = run.outcome
    assert outcome is not None
    reason, sequence = _stop(outcome)
    yield sse_event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": {"output_tokens": outcome.completion_tokens},
        },
    )
    yield sse_event("message_stop", {"type": "message_stop"})


async def create_message(
    state: ServerState, request: Request[Any, Any, Any], body: MessagesRequest
) -> Response[Any] | Stream:
    model = body.model
    state.check_model(model)
    job = to_job(body)
    isolate(job, state.settings.context_cache.isolation, request.headers)
    run = await until_disconnect(request, state.generator.start(job))
    mid = f"msg_{run.job.request_id}"
    if body.stream:
        return sse_response(_events(mid, model, run), run.cancel)
    try:
        outcome = await until_disconnect(request, run.collect())
    finally:
        run.cancel()
    return Response(message_body(mid, model, outcome))


async def count_tokens(state: ServerState, body: CountTokensRequest) -> dict[str, Any]:
    state.check_model(body.model)
    return {"input_tokens": await state.generator.count(to_job(body))}
