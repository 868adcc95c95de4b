"""The server's own routes: readiness, Prometheus metrics, the model objects (both SDKs'
shapes at once) and the OpenAPI document."""

from __future__ import annotations

import time
from typing import Any

from litestar import MediaType, Request, Response, get
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import ResponseSpec

from ..http import ServerState
from ..metrics import EXPOSITION_CONTENT_TYPE
from ..openapi_schema import error_specs

__all__ = ["server_routes"]


def server_routes(state: ServerState, root: str | None) -> list[HTTPRouteHandler]:
    """``root``: the artifact's path, which the model objects show (as vLLM shows its model's)."""
    loop, metrics, model_id = state.loop, state.metrics, state.model_id
    max_context = state.settings.engine.max_context
    created = int(time.time())

    def model_object() -> dict[str, Any]:
        return {
            "id": model_id,
            "object": "model",
            "created": created,
            "owned_by": "ninfer",
            "max_model_len": max_context,
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
        responses=error_specs(401),
    )
    async def metrics_endpoint() -> Response[bytes]:
        # the header as given: Litestar would append a second charset to a text/* media type,
        # and Prometheus refuses a Content-Type with a duplicated parameter
        return Response(metrics.render(), headers={"content-type": EXPOSITION_CONTENT_TYPE})

    @get("/v1/models", tags=["models"], summary="The served model", responses=error_specs(401))
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
        responses=error_specs(401, 404),
    )
    async def get_model(name: str) -> dict[str, Any]:
        state.check_model(name.lstrip("/"))
        return model_object()

    @get("/openapi.json", include_in_schema=False)
    async def openapi_json(request: Request[Any, Any, Any]) -> dict[str, Any]:
        return request.app.openapi_schema.to_schema()

    return [health, metrics_endpoint, list_models, get_model, openapi_json]
