"""HTTP connections: a header timeout, a connection limit, one log line per overload episode.

Why this exists: uvicorn's h11 protocol arms its keep-alive timer only once a response is
complete and cancels it on the first byte of the next request, so a connection that never
sends a request, or sends its head a byte at a time (slowloris), is kept forever; enough of
them exhaust the process's file descriptors, and asyncio then logs a traceback for every
failed ``accept()``. uvicorn's own ``limit_concurrency`` answers 503 only once a request
head has arrived on a connection it has already counted, with a warning per request.

``GuardedProtocol`` (the h11 protocol plus this) gives every request head ``header_timeout``
seconds from the connection's opening or from its first byte after a response; past that the
connection gets 408 (if it sent anything) and is closed. Idle connections between requests
keep uvicorn's keep-alive timeout. A connection beyond ``max_connections`` open is not
served: it is answered 503 as soon as it sends anything, then closed. The ``ConnectionGuard``
logs one warning when the limit is first reached and one when ``accept()`` first runs out of
file descriptors; an episode lasts until a minute passes without either, so a server hovering
at the limit does not log a line per connection (asyncio itself reports a failed ``accept()``
once per waiting connection, up to the listen backlog at a time, with a traceback each).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .metrics import Metrics

__all__ = ["ConnectionGuard", "GuardedProtocol", "descriptor_limit", "protocol_for"]

log = logging.getLogger("ninfer_serve")

#: file descriptors left for the process itself (model files, the GPU driver, pipes, logs)
#: when the connection limit is sized from ``ulimit -n``
RESERVED_DESCRIPTORS = 256
#: connections kept by default (when the descriptor limit allows): far more than the lanes
#: and the waiting requests, which are what a client pool's connections are for
DEFAULT_MAX_CONNECTIONS = 4096
_ACCEPT_FAILED = "socket.accept() out of system resource"
#: seconds without a refusal (or a failed accept) that end an overload episode
EPISODE_QUIET_S = 60.0

_TOO_MANY = (
    b'{"error": {"message": "the server has too many connections open; retry later", '
    b'"type": "server_error", "param": null, "code": "too_many_connections"}}'
)
_REFUSED_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: "
    + str(len(_TOO_MANY)).encode()
    + b"\r\n\r\n"
    + _TOO_MANY
)
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
)


def descriptor_limit(wanted: int) -> int:
    """The process's open-file limit after raising its soft limit towards ``wanted`` (as far
    as the hard limit allows: a shell's default 1024 would otherwise cap the connections)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError):
            pass
    return soft


class ConnectionGuard:
    """The limit, the timeouts and the overload episodes of one server's connections."""

    def __init__(self, *, max_connections: int, header_timeout_s: float, metrics: Metrics):
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.metrics = metrics
        #: when a connection was last refused, and when accept() last failed (monotonic s)
        self._last_refused = self._last_failed = -EPISODE_QUIET_S

    @staticmethod
    def _episode_begins(last: float, now: float) -> bool:
        return now - last > EPISODE_QUIET_S

    def admit(self, open_now: int) -> bool:
        """Whether a new connection may be served, ``open_now`` being served already."""
        if open_now < self.max_connections:
            return True
        self.metrics.connection_refused()
        now = time.monotonic()
        if self._episode_begins(self._last_refused, now):
            log.warning(
                "connection limit reached: %d connections open; new ones are answered 503 "
                "until some close (max_connections)",
                open_now,
            )
        self._last_refused = now
        return False

    def counted(self, open_now: int) -> None:
        """A connection was opened or closed: ``open_now`` are served."""
        self.metrics.set_connections(open_now)

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Handle the loop's failed ``accept()`` calls: one line per episode, no tracebacks."""

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if context.get("message") == _ACCEPT_FAILED:
                self._accept_failed(context.get("exception"))
            elif _retry_after_close(context):
                pass  # the listener closed (shutdown) while an accept retry was pending
            else:
                loop.default_exception_handler(context)

        loop.set_exception_handler(handler)

    def _accept_failed(self, error: BaseException | None) -> None:
        now = time.monotonic()
        if self._episode_begins(self._last_failed, now):
            reason = getattr(error, "strerror", None) or error
            log.warning(
                "cannot accept connections (%s): new ones wait until some close; lower "
                "max_connections or raise the limit (ulimit -n)",
                reason,
            )
        self._last_failed = now


def _retry_after_close(context: dict[str, Any]) -> bool:
    """asyncio retries a failed accept a second later; if the listening socket has closed
    by then, the retry fails on its closed descriptor (once per failed accept)."""
    return isinstance(context.get("exception"), ValueError) and "_start_serving" in repr(
        context.get("handle")
    )


class GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol with the guard's header timeout and connection limit."""

    guard: ConnectionGuard  # set on the subclass ``protocol_for`` makes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = not self.guard.admit(len(self.connections))
        if self._refused:
            # not served, not counted: answered once it has sent something (its request is
            # read first, so closing does not reset the connection under the answer)
            self.transport = transport
            self._answered = False
            self._start_head_timer()
            return
        super().connection_made(transport)
        self.guard.counted(len(self.connections))
        self._start_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            if not self._answered:
                self._answered = True
                self.transport.write(_REFUSED_RESPONSE)
                if self.transport.can_write_eof():
                    self.transport.write_eof()  # read (and drop) the rest until the client closes
                else:
                    self.transport.close()
            return
        super().data_received(data)
        self._watch_head()

    def eof_received(self) -> bool | None:
        if self._refused:
            return False  # close
        return super().eof_received()  # type: ignore[func-returns-value]

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        if self._refused:
            return
        super().connection_lost(exc)
        self.guard.counted(len(self.connections))

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_head()  # a pipelined request's head may be waiting, complete or not

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self.guard.metrics.connection_timed_out("idle")
        super().timeout_keep_alive_handler()

    # -- the header timeout ---------------------------------------------------------------------

    def _watch_head(self) -> None:
        """Time a request head that has begun and is not complete; stop once it is."""
        if self.conn.their_state is not h11.IDLE:
            self._stop_head_timer()  # complete: the request is being served
        elif self.conn.trailing_data[0]:
            self._start_head_timer()  # begun (a first byte after a response)

    def _start_head_timer(self) -> None:
        # started once per head, never pushed back by more bytes: a client trickling its
        # head still has header_timeout_s in all
        if self._head_timer is None:
            loop = asyncio.get_running_loop()
            self._head_timer = loop.call_later(self.guard.header_timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._refused:
            self.transport.close()
            return
        if self.conn.their_state is not h11.IDLE:
            return  # the head arrived meanwhile
        self.guard.metrics.connection_timed_out("header")
        if self.conn.trailing_data[0]:
            self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()


def protocol_for(guard: ConnectionGuard) -> type[GuardedProtocol]:
    """The protocol class uvicorn builds each connection with, bound to ``guard``."""
    return type("ServerProtocol", (GuardedProtocol,), {"guard": guard})
