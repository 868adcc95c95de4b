"""The Litestar application: routes, the auth and request-id gate, error shapes, OpenAPI.

Routes are thin: each validates its wire model (Litestar + pydantic), hands it to the protocol
module (``openai.chat``, ``openai.responses``, ``anthropic.messages``) and returns what that
gives. Cross-cutting rules live here once:

* the ``Gate`` (plain ASGI, outermost) gives every response ``x-request-id`` and
  ``request-id`` headers and checks the API key before any body is read (``/health`` is open);
* the body limit (``max_request_mib``, by default sized for the context) is Litestar's, checked
  on ``content-length`` before reading and on the bytes read, so an oversized body is refused
  before any parsing;
* every exception becomes an error in the shape of the API its path belongs to, with a code
  (a request cut off by shutdown included).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from litestar import HttpMethod, Litestar, MediaType, Request, Response, delete, get, post, route
from litestar.exceptions import ClientException, HTTPException, ValidationException
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.openapi.spec import OpenAPI, OpenAPIMediaType, Reference
from litestar.plugins.pydantic import PydanticPlugin
from pydantic.json_schema import models_json_schema

from ninfer_runtime.engine import Engine

from .anthropic import messages as anthropic_messages
from .anthropic.models import CountTokensRequest, MessagesRequest
from .config import Settings
from .cors import CorsPolicy
from .engine_loop import EngineLoop
from .errors import (
    AnthropicErrorBody,
    ApiError,
    OpenAIErrorBody,
    from_exception,
    shown,
    validation_failed,
)
from .generation import Generator
from .http import ClientGone, ServerState
from .metrics import EXPOSITION_CONTENT_TYPE, Metrics
from .openai import chat, completions, responses, tokenize
from .openai.completions import CompletionRequest
from .openai.models import ChatCompletionRequest, InputTokensRequest, ResponsesRequest
from .openai.response_store import ResponseStore
from .openai.tokenize import DetokenizeRequest, TokenizeRequest

__all__ = ["create_app"]

log = logging.getLogger("ninfer_serve")
_OPEN_PATHS = frozenset({"/health"})
_SHUTTING_DOWN = ApiError(503, "the server is shutting down", code="service_unavailable")
_REQUEST_ID = "ninfer.request_id"


def _is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


class Gate:
    """Outermost ASGI layer: request ids on every response, API-key check before the body."""

    def __init__(self, app: Any, api_key: str | None, cors: CorsPolicy | None = None):
        self.app = app
        self._key = api_key.encode() if api_key else None
        self.state: ServerState | None = None  # set by create_app
        #: cross-origin requests: preflights answered before the key check (a browser sends
        #: them without it), and the allowed origins' headers on every response
        self.cors = cors

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        assert self._key is not None
        offered = headers.get(b"x-api-key")
        if offered is None:
            auth = headers.get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            offered = token.strip() if scheme.lower() == b"bearer" else None
        return offered is not None and hmac.compare_digest(offered, self._key)

    async def _send_error(self, error: ApiError, scope: Any, receive: Any, send: Any) -> None:
        request_id = scope[_REQUEST_ID]
        status, body = (
            error.anthropic(request_id) if _is_anthropic(scope["path"]) else error.openai()
        )
        await Response(body, status_code=status, headers=error.headers).to_asgi_response(
            None, Request(scope, receive)
        )(scope, receive, send)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        ok = 0 < len(given) <= 128 and given.isprintable()
        request_id = given if ok else f"req_{secrets.token_hex(12)}"
        scope[_REQUEST_ID] = request_id
        extra = [(b"x-request-id", request_id.encode()), (b"request-id", request_id.encode())]

        started = False

        async def send_with_id(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        if self.cors is not None:
            extra += self.cors.response_headers(headers.get(b"origin"))
            if self.cors.is_preflight(scope["method"], headers):
                if not await self.cors.answer_preflight(headers, send_with_id):
                    origin = headers[b"origin"].decode("latin-1")
                    error = ApiError(
                        403,
                        f"origin {shown(origin)} may not call this server (--allowed-origins)",
                        code="origin_not_allowed",
                    )
                    await self._send_error(error, scope, receive, send_with_id)
                return
        if (
            self._key is not None
            and scope["path"] not in _OPEN_PATHS
            and not self._authorized(headers)
        ):
            error = ApiError(
                401,
                "missing or invalid API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')",
                code="invalid_api_key",
            )
            await self._send_error(error, scope, receive, send_with_id)
            return
        try:
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            # the server cancels what is still running when its shutdown grace ends; the
            # client gets the API's error shape, not the ASGI server's plain-text 500
            if not started:
                with contextlib.suppress(Exception):
                    await self._send_error(_SHUTTING_DOWN, scope, receive, send_with_id)
            raise


_STATUS = {
    400: "invalid request (the body names the field in param)",
    401: "missing or wrong API key",
    404: "unknown model or response",
    413: "request body over the limit (--max-request-mib)",
    429: "server_overloaded: running and waiting requests at capacity",
    503: "request_queue_timeout, model_loading or service_unavailable",
    504: "Anthropic: no lane within the pending timeout",
    529: "Anthropic: running and waiting requests at capacity",
}
_GENERATION = (400, 401, 404, 413, 429, 503)
#: the rules across fields that a request body's schema cannot state (docs/serve.md)
_TOOL_RULE = "a tool_choice naming a tool needs it in tools, one requiring a tool needs tools"
_CONTEXT_RULE = "the rendered prompt must fit the context (tools add several hundred tokens)"
#: image parts are taken though the schemas leave them out (their validity depends on the
#: data and the model)
_IMAGES = " Images, which the schema leaves out, are read as docs/serve.md (Images) says: "
_RULES = {
    "chat": f"Also refused: {_TOOL_RULE}; tool_calls only on assistant messages, other roles "
    "need content, an assistant message content, reasoning or tool_calls; json_schema needs its "
    "schema; tool call arguments must be a JSON object; top_logprobs without logprobs true; n "
    f"above the server's decode lanes; stream_options without stream; {_CONTEXT_RULE}."
    f"{_IMAGES}image_url parts in user messages.",
    "responses": f"Also refused: {_TOOL_RULE}; an empty prompt (instructions, history and input "
    "together); function_call arguments that are not a JSON object; top_logprobs above 0 "
    f"without include message.output_text.logprobs; {_CONTEXT_RULE}."
    f"{_IMAGES}input_image parts in user messages and function_call_output output.",
    "completions": "Also refused: the prompts of a list mixing strings and token ids; a token "
    "id outside the vocabulary; n above the server's decode lanes; stream_options without "
    "stream; min_tokens above max_tokens; more than one answer constraint (guided_* and "
    f"structured_outputs); {_CONTEXT_RULE}.",
    "tokenize": "Give prompt or messages, not both; the template's fields "
    "(add_generation_prompt, continue_final_message, tools, chat_template_kwargs) only with "
    "messages, continue_final_message not with add_generation_prompt, image parts not with "
    "add_special_tokens.",
    "messages": f"Also refused: {_TOOL_RULE}; thinking enabled without budget_tokens below "
    "max_tokens; a last assistant message (a prefill) without text; a conversation that maps to "
    f"no message; {_CONTEXT_RULE}."
    f"{_IMAGES}image blocks in user messages and tool_result content.",
}


def _errors(*statuses: int, anthropic: bool = False) -> dict[int, ResponseSpec]:
    """OpenAPI responses for the errors a route can give, in its API's shape (Anthropic
    clients get 529 and 504 where OpenAI clients get 429 and 503)."""
    if anthropic:
        statuses = tuple({429: 529}.get(s, s) for s in statuses)
        statuses += (504,) if 503 in statuses else ()
    body = AnthropicErrorBody if anthropic else OpenAIErrorBody
    return {s: ResponseSpec(data_container=body, description=_STATUS[s]) for s in statuses}


_REQUEST_MODELS = (
    ChatCompletionRequest,
    CompletionRequest,
    TokenizeRequest,
    DetokenizeRequest,
    ResponsesRequest,
    InputTokensRequest,
    MessagesRequest,
    CountTokensRequest,
)


def _request_body_schemas() -> dict[str, Any]:
    """The request bodies' JSON Schemas as pydantic states them for the models that validate
    them. Litestar's own translation of a model loses constraints (a bound of 0, ``gt``, the
    size of a dict, a field's published-only schema), and a schema laxer than the validation
    promises clients bodies the server refuses."""
    _, schema = models_json_schema(
        [(model, "validation") for model in _REQUEST_MODELS],
        ref_template="#/components/schemas/{model}",
    )
    return schema["$defs"]


_STREAMING = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")


def _complete_the_schema(openapi: OpenAPI) -> None:
    """What Litestar's generated document leaves out: the request bodies' exact schemas, and
    the server-sent events a streaming request (``"stream": true``) is answered with."""
    assert openapi.components.schemas is not None and openapi.paths is not None
    openapi.components.schemas.update(_request_body_schemas())
    for path in _STREAMING:
        operation = openapi.paths[path].post
        assert operation is not None and operation.responses is not None
        ok = operation.responses["200"]
        assert not isinstance(ok, Reference) and ok.content is not None
        ok.content["text/event-stream"] = OpenAPIMediaType()  # one JSON object per event


class _Request(Request[Any, Any, Any]):
    """Litestar's request, with a body nested deeper than the JSON decoder goes as a 400."""

    async def json(self) -> Any:
        try:
            return await super().json()
        except RecursionError:
            raise ClientException("the JSON body is nested too deeply") from None


def _http_error(exc: HTTPException) -> ApiError:
    """Litestar's own errors (404 route, 405, 413, bad JSON, validation) as ``ApiError``."""
    if exc.status_code >= 500:
        log.error("error while serving a request", exc_info=exc)
    error = _http_error_of(exc)
    error.headers = {**(exc.headers or {}), **error.headers}  # 405 keeps its Allow header
    return error


def _http_error_of(exc: HTTPException) -> ApiError:
    status = exc.status_code
    if isinstance(exc, ValidationException):
        problems = exc.extra if isinstance(exc.extra, list) else []
        return validation_failed(map(_problem, problems), len(problems))
    if status == 413:
        return ApiError(
            413,
            "the request body is larger than the server's limit (--max-request-mib)",
            code="request_too_large",
        )
    if status == 404:
        return ApiError(404, "no such endpoint", code="not_found")
    if status == 405:
        return ApiError(405, "method not allowed for this endpoint", code="method_not_allowed")
    if status == 400:
        return ApiError(400, f"invalid request: {exc.detail}", code="invalid_json")
    return ApiError(status, str(exc.detail), code="http_error")


def _problem(problem: Any) -> tuple[str | None, str]:
    """(path, text) of one of Litestar's validation messages."""
    if not isinstance(problem, dict):
        return None, str(problem)
    if problem.get("key") == "data":
        return None, "the request body is missing or is not a JSON object"
    return problem.get("key"), str(problem.get("message"))


def _error_response(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    if isinstance(exc, ClientGone):  # nobody reads it; the access log shows 499
        error = ApiError(499, "the client disconnected", code="client_closed_request")
    elif isinstance(exc, HTTPException):
        error = _http_error(exc)
    else:
        error = from_exception(exc)
    if _is_anthropic(request.url.path):
        status, body = error.anthropic(request.scope.get(_REQUEST_ID))  # type: ignore[call-overload]
    else:
        status, body = error.openai()
    return Response(body, status_code=status, headers=error.headers)


def create_app(
    settings: Settings,
    *,
    model_id: str,
    load: Callable[[], Engine],
    on_loaded: Callable[[Engine | None, str | None], None] | None = None,
    root: str | None = None,
) -> Gate:
    """The ASGI app of one server; the engine loads in its own thread at startup. ``root``:
    the artifact's path, which the model objects show (as vLLM shows its model's)."""
    engine_settings = settings.engine
    spec = settings.speculative.spec_config()
    metrics = Metrics(
        model_id,
        backend=engine_settings.backend,
        # auto: 0 until the engine has loaded and the lanes are chosen
        max_concurrency=(
            0 if engine_settings.max_concurrency == "auto" else engine_settings.max_concurrency
        ),
        max_context=engine_settings.max_context,
        draft_tokens=spec.draft_tokens if spec else 0,
    )
    loop = EngineLoop(
        load,
        max_concurrency=engine_settings.max_concurrency,
        max_pending=engine_settings.max_pending_requests,
        pending_timeout_s=engine_settings.pending_timeout_ms / 1000,
        metrics=metrics,
    )
    loop.on_loaded = on_loaded
    generator = Generator(
        loop,
        default_max_tokens=settings.server.default_max_tokens,
        enable_thinking=settings.server.enable_thinking,
        keepalive=settings.server.keepalive_s,
        images=settings.image_limits,
    )
    state = ServerState(
        settings=settings,
        model_id=model_id,
        loop=loop,
        generator=generator,
        metrics=metrics,
        responses=ResponseStore(settings.server.response_store_max_records),
    )
    created = int(time.time())

    def model_object() -> dict[str, Any]:
        return {
            "id": model_id,
            "object": "model",
            "created": created,
            "owned_by": "ninfer",
            "max_model_len": engine_settings.max_context,
            "root": root if root is not None else model_id,
            "parent": None,
            # Anthropic's model object, so both SDKs can list models
            "type": "model",
            "display_name": model_id,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
        }

    @get(
        "/health",
        tags=["server"],
        summary="Readiness: 200 when the engine accepts work",
        responses={
            503: ResponseSpec(dict[str, str], description="loading, draining or unavailable")
        },
    )
    async def health() -> Response[dict[str, str]]:
        if loop.ready:
            return Response({"status": "ok"})
        if loop.draining:
            status = "draining"
        elif loop.engine is None and loop.load_error is None:
            status = "loading"
        else:
            status = "unavailable"
        return Response({"status": status}, status_code=503)

    @get(
        "/metrics",
        tags=["server"],
        summary="Prometheus metrics (ninfer_* and vllm:* names)",
        media_type=MediaType.TEXT,
        responses=_errors(401),
    )
    async def metrics_endpoint() -> Response[bytes]:
        # the header as given: Litestar would append a second charset to a text/* media type,
        # and Prometheus refuses a Content-Type with a duplicated parameter
        return Response(metrics.render(), headers={"content-type": EXPOSITION_CONTENT_TYPE})

    @get("/v1/models", tags=["models"], summary="The served model", responses=_errors(401))
    async def list_models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [model_object()],
            "has_more": False,
            "first_id": model_id,
            "last_id": model_id,
        }

    @get(
        "/v1/models/{name:path}",
        tags=["models"],
        summary="One model, with max_model_len",
        responses=_errors(401, 404),
    )
    async def get_model(name: str) -> dict[str, Any]:
        state.check_model(name.lstrip("/"))
        return model_object()

    @post(
        "/v1/chat/completions",
        status_code=200,
        responses=_errors(*_GENERATION),
        tags=["openai"],
        summary="OpenAI Chat Completions (stream with SSE)",
        description=_RULES["chat"],
    )
    async def chat_completions(
        request: Request[Any, Any, Any], data: ChatCompletionRequest
    ) -> Response[Any]:
        return await chat.chat_completions(state, request, data)

    @post(
        "/v1/completions",
        status_code=200,
        responses=_errors(*_GENERATION),
        tags=["openai"],
        summary="OpenAI legacy Completions: raw prompts, echo and logprobs (stream with SSE)",
        description=_RULES["completions"],
    )
    async def text_completions(
        request: Request[Any, Any, Any], data: CompletionRequest
    ) -> Response[Any]:
        return await completions.create_completion(state, request, data)

    @post(
        "/tokenize",
        status_code=200,
        responses=_errors(400, 401, 404, 413, 429, 503),
        tags=["tokenizer"],
        summary="Token ids of a prompt or of chat messages (vLLM's shape)",
        description=_RULES["tokenize"],
    )
    async def tokenize_endpoint(data: TokenizeRequest) -> dict[str, Any]:
        return await tokenize.tokenize(state, data)

    @post(
        "/detokenize",
        status_code=200,
        responses=_errors(400, 401, 404, 413, 429, 503),
        tags=["tokenizer"],
        summary="Text of token ids (vLLM's shape)",
    )
    async def detokenize_endpoint(data: DetokenizeRequest) -> dict[str, Any]:
        return await tokenize.detokenize(state, data)

    @post(
        "/v1/responses",
        status_code=200,
        responses=_errors(*_GENERATION),
        tags=["openai"],
        summary="OpenAI Responses (core; stream with semantic SSE events)",
        description=_RULES["responses"],
    )
    async def create_response(
        request: Request[Any, Any, Any], data: ResponsesRequest
    ) -> Response[Any]:
        return await responses.create_response(state, request, data)

    @post(
        "/v1/responses/input_tokens",
        status_code=200,
        responses=_errors(*_GENERATION),
        tags=["openai"],
        summary="Input tokens of a Responses request",
        description=_RULES["responses"],
    )
    async def input_tokens(data: InputTokensRequest) -> dict[str, Any]:
        return await responses.count_input_tokens(state, data)

    @get(
        "/v1/responses/{response_id:str}",
        tags=["openai"],
        summary="A stored response",
        responses=_errors(401, 404),
    )
    async def get_response(response_id: str) -> dict[str, Any]:
        return responses.get_response(state, response_id)

    @get(
        "/v1/responses/{response_id:str}/input_items",
        tags=["openai"],
        summary="Input items of a stored response",
        responses=_errors(401, 404),
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
        responses=_errors(401, 404),
    )
    async def delete_response(response_id: str) -> dict[str, Any]:
        return responses.delete_response(state, response_id)

    @post(
        "/v1/responses/{response_id:str}/cancel",
        status_code=200,
        tags=["openai"],
        summary="Not supported: responses are never background jobs",
        responses=_errors(400, 401, 404),
    )
    async def cancel_response(response_id: str) -> dict[str, Any]:
        state.responses.get(response_id)
        raise ApiError(
            400,
            "only background responses can be cancelled, and this server runs none",
            code="not_background",
            param="response_id",
        )

    @post(
        "/v1/messages",
        status_code=200,
        responses=_errors(*_GENERATION, anthropic=True),
        tags=["anthropic"],
        summary="Anthropic Messages (stream with the content-block lifecycle)",
        description=_RULES["messages"],
    )
    async def messages(request: Request[Any, Any, Any], data: MessagesRequest) -> Response[Any]:
        return await anthropic_messages.create_message(state, request, data)

    @post(
        "/v1/messages/count_tokens",
        status_code=200,
        responses=_errors(*_GENERATION, anthropic=True),
        tags=["anthropic"],
        summary="Input tokens of a Messages request",
        description=_RULES["messages"],
    )
    async def count_tokens(data: CountTokensRequest) -> dict[str, Any]:
        return await anthropic_messages.count_tokens(state, data)

    @get("/openapi.json", include_in_schema=False)
    async def openapi_json(request: Request[Any, Any, Any]) -> dict[str, Any]:
        return request.app.openapi_schema.to_schema()

    async def startup() -> None:
        loop.start()

    async def shutdown() -> None:
        await loop.stop(settings.server.drain_timeout_s)

    app = Litestar(
        route_handlers=[
            health,
            metrics_endpoint,
            list_models,
            get_model,
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
            messages,
            count_tokens,
            openapi_json,
        ],
        on_startup=[startup],
        on_shutdown=[shutdown],
        exception_handlers={Exception: _error_response},
        request_class=_Request,
        # the wire models are strict, and the schema says so; Litestar's default plugin
        # validates with strict=False, which overrides them (false for an int, 0 for a bool)
        plugins=[PydanticPlugin(validate_strict=True)],
        request_max_body_size=settings.max_request_bytes,
        openapi_config=OpenAPIConfig(
            title="ninfer-serve",
            version="1",
            description=f"Serving {model_id}",
            path="/docs",
            render_plugins=[SwaggerRenderPlugin()],
        ),
        debug=False,
    )
    _complete_the_schema(app.openapi_schema)  # once, for /openapi.json and Swagger UI alike
    app.state.ninfer = state
    origins = settings.server.allowed_origins
    cors = CorsPolicy(origins, settings.server.allow_credentials) if origins else None
    gate = Gate(app, settings.server.api_key, cors)
    gate.state = state
    return gate
