"""The engine thread, and the asyncio side's one door to it.

The engine is synchronous and not thread-safe, so exactly one thread owns it (it also loads it:
a GPU backend binds its context to the loading thread). That thread takes submissions and
cancellations from a queue, calls ``step()`` while there is work, and hands each step's events
to the asyncio loop in one ``call_soon_threadsafe`` per step. Everything else (admission,
per-request queues, metrics) lives on the asyncio side, so no lock is shared between threads:
admission in ``admission``, each request's chunks in ``request_stream``, the step's counters in
``engine_readings``. A request leaves its lane when the engine reports it finished, including
after a cancellation, so a client that disconnects frees its lane and the lane's memory within
one engine step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from ninfer_runtime.engine import (
    Engine,
    Event,
    Failed,
    Finished,
    GenerationRequest,
    OutputEvent,
    PromptLogprobs,
    TokenEvent,
)
from ninfer_runtime.errors import EngineError

from .admission import Admission, EngineUnavailable, Ticket
from .engine_readings import CounterGains, Readings
from .lanes import LaneChoice, LaneSetting, choose_lanes
from .metrics import Metrics
from .request_stream import Chunk, RequestStream

__all__ = ["EngineLoop"]

log = logging.getLogger("ninfer_serve")

#: seconds a cancelled request may take to be ended by the engine (one step) at shutdown
_CANCEL_GRACE_S = 5.0


@dataclass
class _Submit:
    request: GenerationRequest
    rendered: tuple[list[int], bool]


@dataclass
class _Cancel:
    request_id: str


class _Stop:
    pass


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
        self._load = load
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
        self._commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._streams: dict[str, RequestStream] = {}
        self._loaded = asyncio.Event()
        #: request id -> when the engine took it, until its first token (engine thread only)
        self._accepted: dict[str, float] = {}
        #: the engine's counters at the last post (engine thread only)
        self._counters = CounterGains()
        self.on_loaded: Callable[[Engine | None, str | None], None] | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine thread; it loads the engine, then serves (call on the loop)."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._thread_main, name="ninfer-engine", daemon=True)
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
        while self._streams and self._thread_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def stop(self, timeout: float) -> None:
        """Drain (see ``drain``), then end the engine thread."""
        await self.drain(timeout)
        self._commands.put(_Stop())
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)

    def _thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

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
        self, ticket: Ticket, request: GenerationRequest, rendered: tuple[list[int], bool]
    ) -> RequestStream:
        """Hand a prepared request to the engine thread; the ticket must hold a lane."""
        assert ticket.has_lane, "submit needs a lane"
        stream = RequestStream(self, request.request_id, ticket)
        self._streams[request.request_id] = stream
        cache = self.engine is not None and self.engine.cache is not None
        self.metrics.started(len(rendered[0]), time.perf_counter() - ticket.arrival, cache=cache)
        self._commands.put(_Submit(request, rendered))
        return stream

    def cancel(self, request_id: str) -> None:
        if request_id in self._streams:
            self._commands.put(_Cancel(request_id))

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

    # -- the engine thread ----------------------------------------------------------------------

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # a closed loop: the server is gone
            self._loop.call_soon_threadsafe(callback, *args)

    def _thread_main(self) -> None:
        try:
            engine = self._load()
        except Exception as exc:  # any load failure is reported, not raised in a thread
            message = str(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, EngineError):
                log.error("loading the engine failed:\n%s", traceback.format_exc())
            self._post(self._loaded_callback, None, message)
            return
        self._post(self._loaded_callback, engine, None)
        self._serve(engine)

    def _serve(self, engine: Engine) -> None:
        inflight: set[str] = set()
        failed: str | None = None
        while True:
            batch: dict[str, Chunk] = {}
            commands = [self._commands.get()] if not engine.has_work else []
            while True:
                try:
                    commands.append(self._commands.get_nowait())
                except queue.Empty:
                    break
            for command in commands:
                if isinstance(command, _Stop):
                    for rid in list(inflight):
                        finished = engine.cancel(rid)
                        if finished is not None:
                            batch.setdefault(rid, Chunk()).finished = finished
                    self._post_batch(batch, engine)
                    return
                if isinstance(command, _Submit):
                    rid = command.request.request_id
                    if failed is not None:
                        batch[rid] = Chunk(error=EngineUnavailable(failed))
                        continue
                    try:
                        engine.submit(command.request, rendered=command.rendered)
                        inflight.add(rid)
                        self._accepted[rid] = time.perf_counter()
                    except Exception as exc:
                        batch[rid] = Chunk(error=exc)
                elif isinstance(command, _Cancel) and command.request_id in inflight:
                    finished = engine.cancel(command.request_id)
                    if finished is not None:
                        inflight.discard(command.request_id)
                        self._accepted.pop(command.request_id, None)
                        batch.setdefault(command.request_id, Chunk()).finished = finished
            if engine.has_work and failed is None:
                try:
                    # a step's first tokens go out before its decode step runs
                    flush = partial(self._deliver_events, engine, inflight)
                    events = engine.step(flush=flush)
                except Exception as exc:
                    failed = f"{type(exc).__name__}: {exc}"
                    log.error("engine step failed:\n%s", traceback.format_exc())
                    self._post(self._engine_failed, failed)
                    for rid in list(inflight):
                        with contextlib.suppress(Exception):  # broken engine: fails anyway
                            engine.cancel(rid)
                        batch.setdefault(rid, Chunk()).error = EngineUnavailable(failed)
                    inflight.clear()
                    events = []
                self._add_events(batch, events, inflight)
            self._post_batch(batch, engine)

    def _deliver_events(self, engine: Engine, inflight: set[str], events: list[Event]) -> None:
        batch: dict[str, Chunk] = {}
        self._add_events(batch, events, inflight)
        self._post_batch(batch, engine)

    def _add_events(self, batch: dict[str, Chunk], events: list[Event], inflight: set[str]) -> None:
        """The engine's events as chunks per request (a finished or failed request leaves
        ``inflight``; its first token carries when the engine took it)."""
        for event in events:
            chunk = batch.get(event.request_id)
            if chunk is None:
                chunk = batch[event.request_id] = Chunk()
            if isinstance(event, TokenEvent):
                chunk.tokens += 1
                chunk.token_events.append(event)
                accepted = self._accepted.pop(event.request_id, None)
                if accepted is not None:
                    chunk.accepted = accepted
            elif isinstance(event, OutputEvent):
                chunk.events.append(event.event)
            elif isinstance(event, PromptLogprobs):
                chunk.prompt_logprobs = event
            elif isinstance(event, Finished):
                chunk.finished = event
                inflight.discard(event.request_id)
                self._accepted.pop(event.request_id, None)
            elif isinstance(event, Failed):
                chunk.error = event.error
                inflight.discard(event.request_id)
                self._accepted.pop(event.request_id, None)

    def _post_batch(self, batch: dict[str, Chunk], engine: Engine) -> None:
        gains = self._counters.take(engine)
        if batch or gains.moved:
            stamp = time.perf_counter()
            for chunk in batch.values():
                chunk.stamp = stamp
            self._post(self._dispatch, batch, Readings.of(engine, gains))
