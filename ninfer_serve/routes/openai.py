"""The OpenAI-shaped routes: Chat Completions, legacy Completions, vLLM's tokenizer routes,
and the Responses API with its stored responses. Each validates its wire model and hands it to
its protocol module under ``openai``."""

from __future__ import annotations

from typing import Any

from litestar import HttpMethod, Request, Response, delete, get, post, route
from litestar.handlers import HTTPRouteHandler

from ..errors import ApiError
from ..http import ServerState
from ..openai import chat, completions, responses, tokenize
from ..openai.completions import CompletionRequest
from ..openai.models import ChatCompletionRequest, InputTokensRequest, ResponsesRequest
from ..openai.tokenize import DetokenizeRequest, TokenizeRequest
from ..openapi_schema import GENERATION, RULES, error_specs

__all__ = ["openai_routes"]


def openai_routes(state: ServerState) -> list[HTTPRouteHandler]:
    @post(
        "/v1/chat/completions",
        status_code=200,
        responses=error_specs(*GENERATION),
        tags=["openai"],
        summary="OpenAI Chat Completions (stream with SSE)",
        description=RULES["chat"],
    )
    async def chat_completions(
        request: Request[Any, Any, Any], data: ChatCompletionRequest
    ) -> Response[Any]:
        return await chat.chat_completions(state, request, data)

    @post(
        "/v1/completions",
        status_code=200,
        responses=error_specs(*GENERATION),
        tags=["openai"],
        summary="OpenAI legacy Completions: raw prompts, echo and logprobs (stream with SSE)",
        description=RULES["completions"],
    )
    async def text_completions(
        request: Request[Any, Any, Any], data: CompletionRequest
    ) -> Response[Any]:
        return await completions.create_completion(state, request, data)

    @post(
        "/tokenize",
        status_code=200,
        responses=error_specs(400, 401, 404, 413, 429, 503),
        tags=["tokenizer"],
        summary="Token ids of a prompt or of chat messages (vLLM's shape)",
        description=RULES["tokenize"],
    )
    async def tokenize_endpoint(data: TokenizeRequest) -> dict[str, Any]:
        return await tokenize.tokenize(state, data)

    @post(
        "/detokenize",
        status_code=200,
        responses=error_specs(400, 401, 404, 413, 429, 503),
        tags=["tokenizer"],
        summary="Text of token ids (vLLM's shape)",
    )
    async def detokenize_endpoint(data: DetokenizeRequest) -> dict[str, Any]:
        return await tokenize.detokenize(state, data)

    @post(
        "/v1/responses",
        status_code=200,
        responses=error_specs(*GENERATION),
        tags=["openai"],
        summary="OpenAI Responses (core; stream with semantic SSE events)",
        description=RULES["responses"],
    )
    async def create_response(
        request: Request[Any, Any, Any], data: ResponsesRequest
    ) -> Response[Any]:
        return await responses.create_response(state, request, data)

    @post(
        "/v1/responses/input_tokens",
        status_code=200,
        responses=error_specs(*GENERATION),
        tags=["openai"],
        summary="Input tokens of a Responses request",
        description=RULES["responses"],
    )
    async def input_tokens(data: InputTokensRequest) -> dict[str, Any]:
        return await responses.count_input_tokens(state, data)

    @get(
        "/v1/responses/{response_id:str}",
        tags=["openai"],
        summary="A stored response",
        responses=error_specs(401, 404),
    )
    async def get_response(response_id: str) -> dict[str, Any]:
        return responses.get_response(state, response_id)

    @get(
        "/v1/responses/{response_id:str}/input_items",
        tags=["openai"],
        summary="Input items of a stored response",
        responses=error_specs(401, 404),
    )
    async def get_input_items(response_id: str) -> dict[str, Any]:
        return responses.get_input_items(state, response_id)

    @route(
        "/v1/responses/{response_id:str}", http_method=HttpMethod.OPTIONS, include_in_schema=False
    )
    async def stored_response_options(response_id: str) -> Response[None]:
        # Litestar answers OPTIONS with the methods of the first handler registered for a path
        # (GET here) and would leave DELETE out of Allow
        return Response(None, status_code=204, headers={"Allow": "DELETE, GET, OPTIONS"})

    @delete(
        "/v1/responses/{response_id:str}",
        status_code=200,
        tags=["openai"],
        summary="Delete a stored response",
        responses=error_specs(401, 404),
    )
    async def delete_response(response_id: str) -> dict[str, Any]:
        return responses.delete_response(state, response_id)

    @post(
        "/v1/responses/{response_id:str}/cancel",
        status_code=200,
        tags=["openai"],
        summary="Not supported: responses are never background jobs",
        responses=error_specs(400, 401, 404),
    )
    async def cancel_response(response_id: str) -> dict[str, Any]:
        state.responses.get(response_id)
        raise ApiError(
            400,
            "only background responses can be cancelled, and this server runs none",
            code="not_background",
            param="response_id",
        )

    return [
        chat_completions,
        text_completions,
        tokenize_endpoint,
        detokenize_endpoint,
        create_response,
        input_tokens,
        stored_response_options,  # before the path's other handlers, or Litestar adds its own
        get_response,
        get_input_items,
        delete_response,
        cancel_response,
    ]
