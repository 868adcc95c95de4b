"""The asyncio side's one door to the engine: its load state, admission, submissions, and the
chunks the engine thread posts, handed to each request's stream.

The engine is synchronous and not thread-safe, so exactly one thread owns it (``engine_thread``); it
hands each step's chunks to the asyncio loop in one ``call_soon_threadsafe`` per step. Everything
else (admission, per-request queues, metrics) lives on the asyncio side, so no lock is shared
between threads: admission in ``admission``, each request's chunks in ``request_stream``, the step's
counters in ``engine_readings``. A request leaves its lane when the engine reports it finished,
including after a cancellation, so a client that disconnects frees its lane and the lane's memory
within one engine step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from ninfer_runtime.engine import Engine, GenerationRequest

from .admission import Admission, EngineUnavailable, Ticket
from .engine_readings import Readings
from .engine_thread import EngineThread, Prepared
from .lanes import LaneChoice, LaneSetting, choose_lanes
from .metrics import Metrics
from .request_stream import Chunk, RequestStream

__all__ = ["EngineLoop"]

#: seconds a cancelled request may take to be ended by the engine (one step) at shutdown
_CANCEL_GRACE_S = 5.0


class EngineLoop:
    """Owns the engine thread and the admission state of one server."""

    def __init__(
        self,
        load: Callable[[], Engine],
        *,
        max_concurrency: LaneSetting,
        max_pending: int,
        pending_timeout_s: float,
        metrics: Metrics,
    ):
        #: ``auto``: the lanes are chosen once the engine is loaded (``lanes.choose_lanes``)
        self._lane_setting = max_concurrency
        self.lane_choice: LaneChoice | None = None
        lanes = 0 if max_concurrency == "auto" else int(max_concurrency)
        self.admission = Admission(lanes, max_pending, pending_timeout_s, metrics)
        self.metrics = metrics
        self.engine: Engine | None = None
        self.load_error: str | None = None
        self.failed: str | None = None
        self.draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = EngineThread(
            load,
            self._post,
            on_loaded=self._loaded_callback,
            on_batch=self._dispatch,
            on_failed=self._engine_failed,
        )
        self._streams: dict[str, RequestStream] = {}
        self._loaded = asyncio.Event()
        self.on_loaded: Callable[[Engine | None, str | None], None] | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine thread; it loads the engine, then serves (call on the loop)."""
        self._loop = asyncio.get_running_loop()
        self._thread.start()

    async def wait_loaded(self) -> None:
        await self._loaded.wait()

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.failed is None and not self.draining

    @property
    def max_concurrency(self) -> int:
        return self.admission.max_concurrency

    @property
    def running(self) -> int:
        return self.admission.running

    @property
    def waiting(self) -> int:
        return self.admission.waiting

    async def drain(self, timeout: float) -> None:
        """Refuse new work and fail the queued requests (503), let running requests finish for
        up to ``timeout`` s, then cancel the rest and wait for the engine to end them.

        Idempotent. The server drains before it waits for open connections, so every request
        gets its answer from here rather than being cut off by the ASGI server.
        """
        self.draining = True
        self.metrics.set_ready(False)
        self.admission.refuse_waiters()
        deadline = time.monotonic() + timeout
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for rid in list(self._streams):
            self.cancel(rid)
        deadline = time.monotonic() + _CANCEL_GRACE_S
        while self._streams and self._thread.alive and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def stop(self, timeout: float) -> None:
        """Drain (see ``drain``), then end the engine thread."""
        await self.drain(timeout)
        await asyncio.to_thread(self._thread.stop, 10)

    def _loaded_callback(self, engine: Engine | None, error: str | None) -> None:
        if engine is not None:
            self.lane_choice = choose_lanes(self._lane_setting, engine)
            self.admission.open_lanes(self.lane_choice)
        self.engine = engine
        self.load_error = error
        self.metrics.set_ready(engine is not None)
        self._loaded.set()
        if self.on_loaded is not None:
            self.on_loaded(engine, error)

    # -- admission (asyncio side) ---------------------------------------------------------------

    def check_available(self) -> None:
        if self.engine is None:
            if self.load_error is not None:
                raise EngineUnavailable(f"the model failed to load: {self.load_error}")
            raise EngineUnavailable("the model is still loading", loading=True)
        if self.failed is not None:
            raise EngineUnavailable(f"the engine failed and cannot serve: {self.failed}")
        if self.draining:
            raise EngineUnavailable("the server is shutting down")

    def admit(self) -> Ticket:
        """A ticket for a new request (see ``Admission.admit``), when the engine can serve."""
        self.check_available()
        return self.admission.admit()

    async def acquire_lane(self, ticket: Ticket) -> None:
        """Wait for a decode lane (see ``Admission.acquire_lane``), when the engine can serve."""
        self.check_available()
        await self.admission.acquire_lane(ticket)

    def release(self, ticket: Ticket) -> None:
        """Give back the ticket (and its lane); idempotent."""
        self.admission.release(ticket)

    # -- requests (asyncio side) ----------------------------------------------------------------

    def submit(
        self, ticket: Ticket, request: GenerationRequest, prepared: Prepared
    ) -> RequestStream:
        """Hand a prepared request to the engine thread; the ticket must hold a lane."""
        assert ticket.has_lane, "submit needs a lane"
        stream = RequestStream(self, request.request_id, ticket)
        self._streams[request.request_id] = stream
        cache = self.engine is not None and self.engine.cache is not None
        self.metrics.started(len(prepared.ids), time.perf_counter() - ticket.arrival, cache=cache)
        self._thread.submit(request, prepared)
        return stream

    def cancel(self, request_id: str) -> None:
        if request_id in self._streams:
            self._thread.cancel(request_id)

    # -- posted by the engine thread ------------------------------------------------------------

    def _dispatch(self, batch: dict[str, Chunk], readings: Readings) -> None:
        self.admission.engine_lanes = readings.lanes
        # the streams first: nothing a counter does may keep their tokens from them
        for rid, chunk in batch.items():
            stream = self._streams.get(rid)
            if stream is None:
                continue
            stream._deliver(chunk)
            if chunk.last:
                del self._streams[rid]
                self.release(stream.ticket)
        readings.feed(self.metrics)
        self.admission.gauges()

    def _engine_failed(self, message: str) -> None:
        self.failed = message
        self.metrics.set_ready(False)

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # a closed loop: the server is gone
            self._loop.call_soon_threadsafe(callback, *args)
