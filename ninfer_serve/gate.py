"""The outermost ASGI layer: a request id on every response, cross-origin preflights, and the
API-key check before any body is read (``/health`` is open).

A request the server cancels at its shutdown grace still gets an error in its API's shape, not
the ASGI server's plain-text 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
from typing import Any

from litestar import Request, Response

from .cors import CorsPolicy
from .errors import ApiError, shown
from .http import ServerState

__all__ = ["REQUEST_ID", "Gate", "is_anthropic"]

_OPEN_PATHS = frozenset({"/health"})
_SHUTTING_DOWN = ApiError(503, "the server is shutting down", code="service_unavailable")
#: the scope key of the request's id, for the error responses' Anthropic shape
REQUEST_ID = "ninfer.request_id"


def is_anthropic(path: str) -> bool:
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
        request_id = scope[REQUEST_ID]
        status, body = (
            error.anthropic(request_id) if is_anthropic(scope["path"]) else error.openai()
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
        scope[REQUEST_ID] = request_id
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
