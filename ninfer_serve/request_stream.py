"""One submitted request on the asyncio side: the chunks the engine thread posts for it, in
order, its cancel, and the per-request metrics (time to first token, inter-token gaps, how it
finished) taken as each chunk arrives.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ninfer_runtime.engine import Finished, PromptLogprobs, TokenEvent
from ninfer_runtime.frontend import ParseEvent

from .admission import Ticket

if TYPE_CHECKING:
    from .engine_loop import EngineLoop

__all__ = ["Chunk", "RequestStream"]


@dataclass
class Chunk:
    """What one engine step produced for one request."""

    events: list[ParseEvent] = field(default_factory=list)
    tokens: int = 0
    #: the step's generated tokens, each with its scores when the request asked for them
    token_events: list[TokenEvent] = field(default_factory=list)
    #: the prompt's scores (``prompt_logprobs``), on the chunk where the prompt was read
    prompt_logprobs: PromptLogprobs | None = None
    finished: Finished | None = None
    error: Exception | None = None
    stamp: float = 0.0  # perf_counter on the engine thread when the step ended
    #: on a request's first token: when the engine took the request (engine thread)
    accepted: float | None = None

    @property
    def last(self) -> bool:
        return self.finished is not None or self.error is not None


class RequestStream:
    """The asyncio side of one submitted request: its chunks, in order, and its cancel."""

    def __init__(self, owner: EngineLoop, request_id: str, ticket: Ticket):
        self.owner = owner
        self.request_id = request_id
        self.ticket = ticket
        self.queue: asyncio.Queue[Chunk] = asyncio.Queue()
        self.done = False
        #: set when the consumer ends the request on purpose (the reply was complete), so the
        #: cancellation counts as a completed request
        self.ended_early = False
        self.first_token_at: float | None = None
        self._last_token_at: float | None = None

    def _deliver(self, chunk: Chunk) -> None:
        metrics = self.owner.metrics
        if chunk.tokens:
            if self._last_token_at is None:
                self.first_token_at = chunk.stamp
                metrics.first_token(chunk.stamp - self.ticket.arrival)
                if chunk.accepted is not None:
                    metrics.prefilled(chunk.stamp - chunk.accepted)
                metrics.tokens(chunk.tokens, None)
            else:
                metrics.tokens(chunk.tokens, chunk.stamp - self._last_token_at)
            self._last_token_at = chunk.stamp
        if chunk.finished is not None:
            f = chunk.finished
            cancelled = f.reason == "cancelled" and not self.ended_early
            outcome = "cancelled" if cancelled else "completed"
            metrics.finished(
                outcome,
                f.reason,
                chunk.stamp - self.ticket.arrival,
                f.usage.completion_tokens,
                f.usage.reasoning_tokens,
            )
        elif chunk.error is not None:
            metrics.requests.labels("failed").inc()
        self.queue.put_nowait(chunk)

    async def chunks(self, keepalive: float | None = None) -> AsyncIterator[Chunk | None]:
        """Chunks until the last one; ``None`` after ``keepalive`` seconds without one."""
        while not self.done:
            # asyncio.timeout, not wait_for: wait_for (3.11) can swallow a cancellation that
            # races with a completed get(), and a disconnect would then go unnoticed
            try:
                async with asyncio.timeout(keepalive):
                    chunk = await self.queue.get()
            except TimeoutError:
                yield None
                continue
            if chunk.last:
                self.done = True
            yield chunk

    def cancel(self) -> None:
        """Stop generating now (client gone, or the reply is complete); idempotent."""
        if not self.done:
            self.owner.cancel(self.request_id)
