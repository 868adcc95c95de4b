"""The Litestar application of one server: its parts wired together, and its lifecycle.

Routes are thin: each validates its wire model (Litestar + pydantic), hands it to the protocol
module (``openai.chat``, ``openai.responses``, ``anthropic.messages``) and returns what that
gives; they are registered per API (``routes.server``, ``routes.openai``, ``routes.anthropic``).
Cross-cutting rules live once:

* the ``Gate`` (``gate``: plain ASGI, outermost) gives every response ``x-request-id`` and
  ``request-id`` headers and checks the API key before any body is read (``/health`` is open);
* the body limit (``max_request_mib``, by default sized for the context) is Litestar's, checked
  on ``content-length`` before reading and on the bytes read, so an oversized body is refused
  before any parsing;
* every exception becomes an error in the shape of the API its path belongs to, with a code
  (``error_responses``; a request cut off by shutdown included, in the ``Gate``);
* the OpenAPI document is completed where Litestar's falls short (``openapi_schema``).
"""

from __future__ import annotations

from collections.abc import Callable

from litestar import Litestar
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.plugins.pydantic import PydanticPlugin

from ninfer_runtime.engine import Engine

from .config import Settings
from .cors import CorsPolicy
from .engine_loop import EngineLoop
from .error_responses import JsonRequest, error_response
from .gate import Gate
from .generation import Generator
from .http import ServerState
from .metrics import Metrics
from .openai.response_store import ResponseStore
from .openapi_schema import complete_the_schema
from .routes.anthropic import anthropic_routes
from .routes.openai import openai_routes
from .routes.server import server_routes

__all__ = ["create_app"]


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

    async def startup() -> None:
        loop.start()

    async def shutdown() -> None:
        await loop.stop(settings.server.drain_timeout_s)

    app = Litestar(
        route_handlers=[
            *server_routes(state, root),
            *openai_routes(state),
            *anthropic_routes(state),
        ],
        on_startup=[startup],
        on_shutdown=[shutdown],
        exception_handlers={Exception: error_response},
        request_class=JsonRequest,
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
    complete_the_schema(app.openapi_schema)  # once, for /openapi.json and Swagger UI alike
    app.state.ninfer = state
    origins = settings.server.allowed_origins
    cors = CorsPolicy(origins, settings.server.allow_credentials) if origins else None
    gate = Gate(app, settings.server.api_key, cors)
    gate.state = state
    return gate
