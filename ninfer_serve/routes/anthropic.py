"""The Anthropic-shaped routes: Messages and its token count."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.handlers import HTTPRouteHandler

from ..anthropic import messages as anthropic_messages
from ..anthropic.models import CountTokensRequest, MessagesRequest
from ..http import ServerState
from ..openapi_schema import GENERATION, RULES, error_specs

__all__ = ["anthropic_routes"]


def anthropic_routes(state: ServerState) -> list[HTTPRouteHandler]:
    @post(
        "/v1/messages",
        status_code=200,
        responses=error_specs(*GENERATION, anthropic=True),
        tags=["anthropic"],
        summary="Anthropic Messages (stream with the content-block lifecycle)",
        description=RULES["messages"],
    )
    async def messages(request: Request[Any, Any, Any], data: MessagesRequest) -> Response[Any]:
        return await anthropic_messages.create_message(state, request, data)

    @post(
        "/v1/messages/count_tokens",
        status_code=200,
        responses=error_specs(*GENERATION, anthropic=True),
        tags=["anthropic"],
        summary="Input tokens of a Messages request",
        description=RULES["messages"],
    )
    async def count_tokens(data: CountTokensRequest) -> dict[str, Any]:
        return await anthropic_messages.count_tokens(state, data)

    return [messages, count_tokens]
