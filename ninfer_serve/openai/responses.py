"""POST /v1/responses and friends: the OpenAI Responses API "core" on the shared adapter.

A request becomes a generation job (``response_request``: input items as chat messages via
``response_items``); the run's parse events become typed output items (reasoning, message,
function_call) and, when streaming, semantic SSE events (``response_events``). Here the response
object is built, streamed or collected, and stored (``response_store``) unless ``store`` is
false.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response
from litestar.response import Stream

from ..cache_isolation import isolate
from ..errors import from_exception
from ..generation import Outcome, Run
from ..http import KEEPALIVE, ServerState, new_id, sse_response, until_disconnect
from .models import InputTokensRequest, ResponsesRequest
from .response_events import ResponseBuilder
from .response_items import output_messages
from .response_request import LOGPROBS_INCLUDE, to_job
from .response_store import Stored

__all__ = [
    "count_input_tokens",
    "create_response",
    "delete_response",
    "get_input_items",
    "get_response",
]


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
    state.responses.put(Stored(response, items, history + output_messages(response["output"])))


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
