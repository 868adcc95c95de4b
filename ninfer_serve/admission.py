"""Admission: who runs, who waits, who is refused.

Admission follows NInfer: ``max_concurrency`` requests hold decode lanes, ``max_pending`` more
may wait (FIFO) for one; a request beyond that is refused at once (429), and one that waits
longer than the pending timeout, measured from arrival, is refused with 503. All of it lives on
the asyncio side, so no lock is needed; the engine loop releases a request's ticket when the
engine reports it finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass

from .lanes import LaneChoice
from .metrics import Metrics

__all__ = ["Admission", "EngineUnavailable", "Overloaded", "QueueTimeout", "Ticket"]


class Overloaded(Exception):
    """Running plus waiting requests are at capacity (HTTP 429, Anthropic 529)."""


class QueueTimeout(Exception):
    """No lane became free within the pending timeout (HTTP 503, Anthropic 504)."""


class EngineUnavailable(Exception):
    """The engine is loading, failed, or the server is shutting down (HTTP 503)."""

    def __init__(self, message: str, *, loading: bool = False):
        super().__init__(message)
        self.loading = loading


@dataclass
class Ticket:
    """One admitted request, from arrival until its lane is released."""

    arrival: float
    deadline: float
    has_lane: bool = False
    released: bool = False


class Admission:
    """The lanes and the waiting line of one server (asyncio side only)."""

    def __init__(
        self, max_concurrency: int, max_pending: int, pending_timeout_s: float, metrics: Metrics
    ):
        self.max_concurrency = max_concurrency
        self.max_pending = max_pending
        self.pending_timeout_s = pending_timeout_s
        self.metrics = metrics
        self._admitted = 0  # tickets not yet released (preparing, waiting or running)
        self._free_lanes = max_concurrency
        #: requests the engine runs (a lane and their context pages), as its last post said
        self.engine_lanes = 0
        self._waiters: deque[asyncio.Future[bool]] = deque()

    @property
    def running(self) -> int:
        return self.max_concurrency - self._free_lanes

    @property
    def waiting(self) -> int:
        return self._admitted - self.running

    def open_lanes(self, choice: LaneChoice) -> None:
        """Set the lanes before the first request: none is admitted while loading."""
        assert self._admitted == 0
        self.max_concurrency = self._free_lanes = choice.lanes
        self.metrics.set_max_concurrency(choice.lanes)

    def refuse_waiters(self) -> None:
        """Every request waiting for a lane is refused (``acquire_lane`` raises)."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(False)

    def admit(self) -> Ticket:
        """A ticket for a new request, or ``Overloaded`` when running + waiting is full."""
        if self._admitted >= self.max_concurrency + self.max_pending:
            self.metrics.rejected("overloaded")
            raise Overloaded(
                f"the server is at capacity ({self.max_concurrency} running, "
                f"{self.max_pending} waiting); retry later"
            )
        now = time.perf_counter()
        self._admitted += 1
        self.gauges()
        return Ticket(arrival=now, deadline=now + self.pending_timeout_s)

    async def acquire_lane(self, ticket: Ticket) -> None:
        """Wait (FIFO) for a decode lane until the ticket's deadline (``EngineUnavailable``
        when the waiters are refused meanwhile)."""
        if self._free_lanes > 0 and not self._waiters:
            self._free_lanes -= 1
            ticket.has_lane = True
            self.gauges()
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(waiter)
        deadline = loop.time() + (ticket.deadline - time.perf_counter())
        try:
            async with asyncio.timeout_at(deadline):
                await asyncio.shield(waiter)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self._pass_lane_on()  # granted at the last moment: give it to the next one
            else:
                waiter.cancel()
            self._remove_waiter(waiter)
            self.release(ticket)
            if isinstance(exc, TimeoutError):
                self.metrics.rejected("queue_timeout")
                raise QueueTimeout(
                    f"no decode lane became free within {self.pending_timeout_s * 1000:.0f} ms "
                    f"({self.max_concurrency} running, {self.waiting} waiting)"
                ) from None
            raise
        if not waiter.result():  # refused by drain
            self._remove_waiter(waiter)
            self.release(ticket)
            raise EngineUnavailable("the server is shutting down")
        ticket.has_lane = True
        self.gauges()

    def _remove_waiter(self, waiter: asyncio.Future[bool]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)

    def _pass_lane_on(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return
        self._free_lanes += 1

    def release(self, ticket: Ticket) -> None:
        """Give back the ticket (and its lane); idempotent."""
        if ticket.released:
            return
        ticket.released = True
        self._admitted -= 1
        if ticket.has_lane:
            ticket.has_lane = False
            self._pass_lane_on()
        self.gauges()

    def gauges(self) -> None:
        self.metrics.set_queue(self.running, self.waiting, min(self.engine_lanes, self._admitted))
