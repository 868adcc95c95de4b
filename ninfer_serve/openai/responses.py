"""POST /v1/responses and friends: the OpenAI Responses API "core" on the shared adapter.

Input items become chat messages (instructions first, then the stored conversation of
``previous_response_id``, then ``input``); output events become typed output items (reasoning,
message, function_call) and, when streaming, the semantic SSE events with a monotonic
``sequence_number``. With ``include: ["message.output_text.logprobs"]`` an ``output_text`` part
lists the log-probabilities of its tokens: those generated since the previous output event
(reasoning and tool-call tokens belong to their items, which have no such field), and a
``response.output_text.delta`` event those of its delta. Stored responses live in a bounded
in-memory LRU: a restart forgets them, and the oldest go first when it is full (a later
``previous_response_id`` to them gets 404).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from litestar import Request, Response
from litestar.response import Stream

from ninfer_runtime.engine import TokenEvent
from ninfer_runtime.frontend import (
    ParseEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)

from ..cache_isolation import isolate
from ..errors import ApiError, from_exception, invalid_request, shown
from ..generation import Job, Outcome, Run
from ..http import KEEPALIVE, ServerState, new_id, sse_event, sse_response, until_disconnect
from ..images import image_bytes
from .chat import requested_effort, thinking_for_effort
from .content import input_image
from .logprobs import scored, text_logprobs
from .models import InputTokensRequest, ResponsesRequest

__all__ = [
    "ResponseStore",
    "count_input_tokens",
    "create_response",
    "delete_response",
    "get_input_items",
    "get_response",
]

_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
#: the ``include`` value that asks for the output text's log-probabilities
LOGPROBS_INCLUDE = "message.output_text.logprobs"


#: the bytes of images stored conversations may hold together (each record counts its
#: conversation's images and the base64 its input items keep); beyond it the oldest go
STORED_IMAGE_BYTES = 512 * 1024 * 1024


@dataclass
class Stored:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    #: the whole conversation as chat messages, including this response's output
    messages: list[dict[str, Any]]

    @property
    def image_bytes(self) -> int:
        return (image_bytes(self.messages) * 7 + 2) // 3  # the bytes, and 4/3 of them in base64


class ResponseStore:
    """Bounded LRU of stored responses (``max_records`` 0 stores nothing), holding at most
    ``max_image_bytes`` of images (a record over it is not kept)."""

    def __init__(self, max_records: int, max_image_bytes: int = STORED_IMAGE_BYTES):
        self.max_records = max_records
        self.max_image_bytes = max_image_bytes
        self._items: OrderedDict[str, tuple[Stored, int]] = OrderedDict()
        self._image_bytes = 0

    def put(self, record: Stored) -> None:
        if self.max_records <= 0:
            return
        rid = record.response["id"]
        if rid in self._items:
            self._drop(rid)
        size = record.image_bytes
        if size > self.max_image_bytes:
            return  # would push every other record out and still not fit
        self._items[rid] = (record, size)
        self._image_bytes += size
        while self._items and (
            len(self._items) > self.max_records or self._image_bytes > self.max_image_bytes
        ):
            self._drop(next(iter(self._items)))

    def _drop(self, rid: str) -> None:
        _, size = self._items.pop(rid)
        self._image_bytes -= size

    def get(self, rid: str, param: str | None = None) -> Stored:
        record = self._items.get(rid)
        if record is None:
            raise ApiError(
                404,
                f"Response with id {shown(rid)} not found.",
                code="response_not_found",
                param=param,
            )
        self._items.move_to_end(rid)
        return record[0]

    def delete(self, rid: str) -> None:
        self.get(rid)
        self._drop(rid)


# -- input items -> chat messages -----------------------------------------------------------------


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


def _output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


# -- request -> job -------------------------------------------------------------------------------


def _refuse(body: ResponsesRequest | InputTokensRequest) -> None:
    if isinstance(body, ResponsesRequest):
        if body.background:
            raise ApiError(
                400,
                "background: background responses are not supported",
                code="unsupported_parameter",
                param="background",
            )
        if body.top_logprobs and LOGPROBS_INCLUDE not in (body.include or ()):
            raise ApiError(
                400,
                f"top_logprobs: needs include [{LOGPROBS_INCLUDE!r}] (the log-probabilities "
                "come with the output text)",
                code="invalid_value",
                param="top_logprobs",
            )
    if body.truncation == "auto":
        raise ApiError(
            400,
            "truncation: only 'disabled' is supported",
            code="unsupported_value",
            param="truncation",
        )
    if isinstance(body, InputTokensRequest) and body.conversation is not None:
        raise ApiError(
            400,
            "conversation: conversations are not supported",
            code="unsupported_parameter",
            param="conversation",
        )


def conversation(
    state: ServerState, body: ResponsesRequest | InputTokensRequest
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages for the prompt, history to store) for a request."""
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        history = list(
            state.responses.get(body.previous_response_id, "previous_response_id").messages
        )
    history += input_messages(body.input)
    prompt = list(history)
    if body.instructions:
        prompt.insert(0, {"role": "system", "content": body.instructions})
    if not prompt:
        raise invalid_request("input is empty", "input")
    return prompt, history


def to_job(
    state: ServerState, body: ResponsesRequest | InputTokensRequest
) -> tuple[Job, list[dict[str, Any]]]:
    _refuse(body)
    prompt, history = conversation(state, body)
    tools = [
        {"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
        for t in body.tools or []
    ]
    choice = body.tool_choice
    tool_choice = (
        ("auto" if tools else "none")
        if choice is None
        else (choice if isinstance(choice, str) else choice.name)
    )
    if tool_choice not in ("auto", "none", "required") and tool_choice not in {
        t["function"]["name"] for t in tools
    }:
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
    schema = None
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type == "json_object":
        schema = {}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise invalid_request("text.format.schema is required", "text.format.schema")
        schema = fmt.schema_
    effort = body.reasoning.effort if body.reasoning is not None else None
    thinking, budget = thinking_for_effort(effort)
    sampling: dict[str, Any] = {}
    if isinstance(body, ResponsesRequest):
        sampling = {
            "max_thinking_tokens": body.max_thinking_tokens or budget,
            "max_tokens": body.max_output_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "top_k": 0 if body.top_k == -1 else body.top_k,
            "min_p": body.min_p,
            "seed": body.seed,
        }
        if LOGPROBS_INCLUDE in (body.include or ()):
            sampling["logprobs"] = body.top_logprobs or 0
    job = Job(
        messages=prompt,
        tools=tools or None,
        tool_choice=tool_choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        json_schema=schema,
        json_schema_param="text.format.schema",
        sampling=sampling,
        enable_thinking=thinking,
        reasoning_effort=requested_effort(
            effort,
            "reasoning.effort",
            getattr(body, "max_thinking_tokens", None),
            budget,
        ),
        prompt_param="input",
        cache_salt=body.cache_salt if isinstance(body, ResponsesRequest) else None,
    )
    return job, history


# -- output ---------------------------------------------------------------------------------------


class ResponseBuilder:
    """Folds parse events into output items, and (streaming) into semantic SSE events.

    With ``tokens`` (the run's generated tokens, a list that grows as they come) and a
    ``tokenizer``, each text delta carries the log-probabilities of the tokens that came
    since the previous event, less any up to the end of the reasoning (``</think>``, which no
    reasoning event shows when it is the last of its tokens).
    """

    def __init__(
        self,
        skeleton: dict[str, Any],
        tokens: list[TokenEvent] | None = None,
        tokenizer: Any | None = None,
    ):
        self.skeleton = skeleton
        self.output: list[dict[str, Any]] = []
        self.sequence = 0
        self._open: dict[str, Any] | None = None  # the item receiving deltas
        self._calls: dict[int, dict[str, Any]] = {}
        self._tokens = tokens if tokenizer is not None else None
        self._tokenizer = tokenizer
        close = tokenizer.think_close_ids if tokenizer is not None else ()
        self._reasoning_end = close[-1] if close else None
        self._taken = 0  # tokens already given to an event

    def _take_tokens(self) -> list[TokenEvent]:
        """The answer tokens no event has taken yet (none when not asked for)."""
        if self._tokens is None:
            return []
        fresh = self._tokens[self._taken :]
        self._taken += len(fresh)
        ends = [i for i, t in enumerate(fresh) if t.token_id == self._reasoning_end]
        return fresh[ends[-1] + 1 :] if ends else fresh

    def _logprobs(self, tokens: list[TokenEvent]) -> list[dict[str, Any]]:
        return text_logprobs(self._tokenizer, scored(tokens)) if tokens else []

    def event(self, kind: str, /, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse_event(kind, payload)

    def response(self, **changes: Any) -> dict[str, Any]:
        return {**self.skeleton, "output": list(self.output), **changes}

    def _close_open(self) -> list[bytes]:
        item, self._open = self._open, None
        if item is None or item["type"] == "function_call":
            return []
        index = self.output.index(item)
        part = item["content"][0]
        kind = "reasoning_text" if item["type"] == "reasoning" else "output_text"
        item["status"] = "completed"
        extra = {"logprobs": part["logprobs"]} if kind == "output_text" else {}
        return [
            self.event(
                f"response.{kind}.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                **extra,
            ),
            self.event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def _start(self, item: dict[str, Any], part: dict[str, Any] | None) -> list[bytes]:
        out = self._close_open()
        self.output.append(item)
        index = len(self.output) - 1
        shown = {**item, "content": []} if part is not None else item
        out.append(self.event("response.output_item.added", output_index=index, item=shown))
        if part is not None:
            item["content"] = [part]
            out.append(
                self.event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part={**part},
                )
            )
        self._open = item
        return out

    def feed(self, event: ParseEvent) -> list[bytes]:
        tokens = self._take_tokens()  # a text delta shows them; other items have no place
        if isinstance(event, ReasoningDelta | TextDelta):
            reasoning = isinstance(event, ReasoningDelta)
            kind = "reasoning" if reasoning else "message"
            out: list[bytes] = []
            if self._open is None or self._open["type"] != kind:
                if reasoning:
                    item = {
                        "type": "reasoning",
                        "id": new_id("rs_"),
                        "summary": [],
                        "status": "in_progress",
                    }
                    part = {"type": "reasoning_text", "text": ""}
                else:
                    item = {
                        "type": "message",
                        "id": new_id("msg_"),
                        "status": "in_progress",
                        "role": "assistant",
                    }
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                out = self._start(item, part)
            item = self._open
            assert item is not None
            item["content"][0]["text"] += event.text
            name = "response.reasoning_text.delta" if reasoning else "response.output_text.delta"
            extra = {}
            if not reasoning:
                extra["logprobs"] = logprobs = self._logprobs(tokens)
                item["content"][0]["logprobs"] += logprobs
            out.append(
                self.event(
                    name,
                    item_id=item["id"],
                    output_index=len(self.output) - 1,
                    content_index=0,
                    delta=event.text,
                    **extra,
                )
            )
            return out
        if isinstance(event, ToolCallStart):
            item = {
                "type": "function_call",
                "id": new_id("fc_"),
                "call_id": event.id,
                "name": event.name,
                "arguments": "",
                "status": "in_progress",
            }
            self._calls[event.index] = item
            return self._start(item, None)
        if isinstance(event, ToolCallArgumentsDelta) and event.index in self._calls:
            item = self._calls[event.index]
            item["arguments"] += event.text
            return [
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self.output.index(item),
                    delta=event.text,
                )
            ]
        if isinstance(event, ToolCallEnd) and event.index in self._calls:
            item = self._calls[event.index]
            item["status"] = "incomplete" if event.cut_off else "completed"
            index = self.output.index(item)
            if self._open is item:
                self._open = None
            return [
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                ),
                self.event("response.output_item.done", output_index=index, item=item),
            ]
        return []

    def finish(self) -> list[bytes]:
        # tokens whose text never came out (a stop string, say) belong to the open text
        tokens = self._take_tokens()
        if self._open is not None and self._open["type"] == "message":
            self._open["content"][0]["logprobs"] += self._logprobs(tokens)
        out = self._close_open()
        # a call that never ended (abandoned by the parser) is not part of the answer
        self.output[:] = [i for i in self.output if i["status"] != "in_progress"]
        return out


def _usage(outcome: Outcome) -> dict[str, Any]:
    return {
        "input_tokens": outcome.prompt_tokens,
        "input_tokens_details": {"cached_tokens": outcome.cached_tokens},
        "output_tokens": outcome.completion_tokens,
        "output_tokens_details": {
            "reasoning_tokens": outcome.reasoning_tokens,
            "accepted_prediction_tokens": outcome.accepted_draft_tokens,
            "rejected_prediction_tokens": outcome.rejected_draft_tokens,
        },
        "total_tokens": outcome.total_tokens,
    }


def _final(builder: ResponseBuilder, outcome: Outcome) -> dict[str, Any]:
    if outcome.finish_reason == "length":
        return builder.response(
            status="incomplete",
            incomplete_details={"reason": "max_output_tokens"},
            usage=_usage(outcome),
        )
    return builder.response(status="completed", usage=_usage(outcome))


def _skeleton(state: ServerState, body: ResponsesRequest, rid: str, model: str) -> dict[str, Any]:
    fmt = body.text.format if body.text is not None and body.text.format else None
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": body.max_tool_calls,
        "model": model,
        "output": [],
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
        "service_tier": "default",
        "store": body.store is not False,
        "temperature": body.temperature,
        "text": {
            "format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
        },
        "tool_choice": (
            body.tool_choice
            if isinstance(body.tool_choice, str) or body.tool_choice is None
            else body.tool_choice.model_dump()
        )
        or "auto",
        "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
        "top_p": body.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": body.user,
        "metadata": body.metadata or {},
    }


def _store(
    state: ServerState,
    body: ResponsesRequest,
    response: dict[str, Any],
    history: list[dict[str, Any]],
) -> None:
    if body.store is False:
        return
    items = (
        [{"type": "message", "role": "user", "content": body.input}]
        if isinstance(body.input, str)
        else list(body.input)
    )
    for item in items:
        item.setdefault("id", new_id("msg_"))
    state.responses.put(Stored(response, items, history + _output_messages(response["output"])))


async def _events(
    state: ServerState,
    body: ResponsesRequest,
    run: Run,
    builder: ResponseBuilder,
    history: list[dict[str, Any]],
) -> AsyncIterator[bytes]:
    yield builder.event("response.created", response=builder.response())
    yield builder.event("response.in_progress", response=builder.response())
    try:
        async for data in run.frames(builder.feed, KEEPALIVE):
            yield data
    except Exception as exc:
        error = from_exception(exc)
        yield builder.event(
            "response.failed",
            response=builder.response(
                status="failed",
                error={"code": error.code or "server_error", "message": error.message},
            ),
        )
        return
    for data in builder.finish():
        yield data
    assert run.outcome is not None
    final = _final(builder, run.outcome)
    _store(state, body, final, history)
    name = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield builder.event(name, response=final)


async def create_response(
    state: ServerState, request: Request[Any, Any, Any], body: ResponsesRequest
) -> Response[Any] | Stream:
    model = state.check_model(body.model)
    job, history = to_job(state, body)
    isolate(job, state.settings.context_cache.isolation, request.headers)
    run = await until_disconnect(request, state.generator.start(job))
    skeleton = _skeleton(state, body, f"resp_{run.job.request_id}", model)
    scoring = LOGPROBS_INCLUDE in (body.include or ())
    tokenizer = state.generator.engine.tokenizer if scoring else None
    builder = ResponseBuilder(skeleton, run.tokens, tokenizer)
    if body.stream:
        return sse_response(_events(state, body, run, builder, history), run.cancel)
    try:
        outcome = await until_disconnect(request, _collect(run, builder))
    finally:
        run.cancel()
    final = _final(builder, outcome)
    _store(state, body, final, history)
    return Response(final)


async def _collect(run: Run, builder: ResponseBuilder) -> Outcome:
    async for event in run.events():
        if event is not None:
            builder.feed(event)
    builder.finish()
    assert run.outcome is not None
    return run.outcome


def get_response(state: ServerState, response_id: str) -> dict[str, Any]:
    return state.responses.get(response_id).response


def get_input_items(state: ServerState, response_id: str) -> dict[str, Any]:
    items = state.responses.get(response_id).input_items
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": False,
    }


def delete_response(state: ServerState, response_id: str) -> dict[str, Any]:
    state.responses.delete(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


async def count_input_tokens(state: ServerState, body: InputTokensRequest) -> dict[str, Any]:
    state.check_model(body.model)
    job, _ = to_job(state, body)
    return {"object": "response.input_tokens", "input_tokens": await state.generator.count(job)}
