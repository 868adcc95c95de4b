"""POST /v1/messages and /v1/messages/count_tokens: Anthropic Messages on the shared adapter.

The request becomes a generation job in ``message_request.py`` (content blocks in
``conversation.py``, ``cache_control`` marks in ``cache_control.py``); the answer is built in
``message_output.py`` (collected) or ``message_stream.py`` (streamed).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.response import Stream

from ..cache_isolation import isolate
from ..http import ServerState, sse_response, until_disconnect
from .message_output import message_body
from .message_request import to_job
from .message_stream import message_events
from .models import CountTokensRequest, MessagesRequest

__all__ = ["count_tokens", "create_message", "to_job"]


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
        return sse_response(message_events(mid, model, run), run.cancel)
    try:
        outcome = await until_disconnect(request, run.collect())
    finally:
        run.cancel()
    return Response(message_body(mid, model, outcome))


async def count_tokens(state: ServerState, body: CountTokensRequest) -> dict[str, Any]:
    state.check_model(body.model)
    return {"input_tokens": await state.generator.count(to_job(body))}
