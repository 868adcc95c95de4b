"""HTTP plumbing the front doors share: server state, SSE framing, disconnect watching.

Why watch disconnects by hand: a non-streaming request (or a streaming one still queued or
prefilling) sends nothing until it is done, so the server would only notice a client that gave
up when it tries to write the answer, after spending a lane on it. Watching the ASGI receive
channel turns a disconnect into cancellation at once, wherever the request is.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
from litestar import Request
from litestar.response import Stream

from .config import Settings
from .engine_loop import EngineLoop
from .errors import ApiError, shown
from .generation import Generator
from .metrics import Metrics
from .openai.response_store import ResponseStore

__all__ = [
    "KEEPALIVE",
    "ClientGone",
    "ServerState",
    "new_id",
    "sse_data",
    "sse_event",
    "sse_response",
    "until_disconnect",
]

T = TypeVar("T")
KEEPALIVE = b": keep-alive\n\n"
_encode = msgspec.json.Encoder().encode


class ClientGone(Exception):
    """The client disconnected before the answer was ready (logged as 499, never sent)."""


@dataclass
class ServerState:
    """What every handler needs: settings, the engine loop, the generator and the stores."""

    settings: Settings
    model_id: str
    loop: EngineLoop
    generator: Generator
    metrics: Metrics
    responses: ResponseStore
    started: float = field(default_factory=time.time)

    def check_model(self, requested: str | None) -> str:
        """The served model id; a request naming another model gets 404, as from vLLM."""
        if requested is None or requested == self.model_id:
            return self.model_id
        raise ApiError(
            404,
            f"The model {shown(requested)} does not exist; this server serves "
            f"{shown(self.model_id)}.",
            code="model_not_found",
            param="model",
        )


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def sse_data(payload: Any) -> bytes:
    """One ``data:`` event (OpenAI Chat framing)."""
    return b"data: " + _encode(payload) + b"\n\n"


def sse_event(name: str, payload: Any) -> bytes:
    """One named event (Responses and Anthropic framing)."""
    return b"event: " + name.encode() + b"\ndata: " + _encode(payload) + b"\n\n"


class _Guarded:
    """An ASGI response that runs ``on_close`` however sending ends (done, error, disconnect).

    A body generator's own ``finally`` is not enough: if the client disconnects before the
    first chunk is pulled, the generator never starts and would never clean up, leaving the
    engine generating for nobody.
    """

    def __init__(self, inner: Any, on_close: Callable[[], None]):
        self._inner = inner
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self._inner(scope, receive, send)
        finally:
            self._on_close()


class _GuardedStream(Stream):
    __slots__ = ("on_close",)

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        return _Guarded(super().to_asgi_response(*args, **kwargs), self.on_close)


def sse_response(body: AsyncIterator[bytes], on_close: Callable[[], None]) -> Stream:
    """A text/event-stream response; ``on_close`` runs when sending ends for any reason."""
    stream = _GuardedStream(
        body,
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )
    stream.on_close = on_close
    return stream


async def _wait_disconnect(request: Request[Any, Any, Any]) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise ``ClientGone``."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            watcher.cancel()
            raise
        if task.done():
            watcher.cancel()
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            late = await task
            # the work finished just as it was cancelled: undo what it started (a submitted run)
            if callable(getattr(late, "cancel", None)):
                late.cancel()
        raise ClientGone()
    finally:
        # an error raised here keeps this frame in its traceback, and the frame keeps the task
        # that holds the error: a cycle that would hold the request's body and prompt until the
        # next full garbage collection, which large strings do not bring on
        del task, watcher
