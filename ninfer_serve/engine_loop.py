"""The engine thread and admission: who runs, who waits, who is refused.

The engine is synchronous and not thread-safe, so exactly one thread owns it (it also loads it:
a GPU backend binds its context to the loading thread). That thread takes submissions and
cancellations from a queue, calls ``step()`` while there is work, and hands each step's events
to the asyncio loop in one ``call_soon_threadsafe`` per step. Everything else (admission,
per-request queues, metrics) lives on the asyncio side, so no lock is shared between threads.

Admission follows NInfer: ``max_concurrency`` requests hold decode lanes, ``max_pending`` more
may wait (FIFO) for one; a request beyond that is refused at once (429), and one that waits
longer than the pending timeout, measured from arrival, is refused with 503. A request leaves
its lane when the engine reports it finished, including after a cancellation, so a client that
disconnects frees its lane and the lane's memory within one engine step.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
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
from ninfer_runtime.frontend import ParseEvent
from ninfer_runtime.speculative import SpecStats

from .lanes import LaneChoice, LaneSetting, choose_lanes
from .metrics import Metrics

__all__ = [
    "Chunk",
    "EngineLoop",
    "EngineUnavailable",
    "Overloaded",
    "QueueTimeout",
    "RequestStream",
    "Ticket",
]

log = logging.getLogger("ninfer_serve")

#: seconds a cancelled request may take to be ended by the engine (one step) at shutdown
_CANCEL_GRACE_S = 5.0


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


@dataclass
class Ticket:
    """One admitted request, from arrival until its lane is released."""

    arrival: float
    deadline: float
    has_lane: bool = False
    released: bool = False


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
        self.max_concurrency = 0 if max_concurrency == "auto" else int(max_concurrency)
        self.max_pending = max_pending
        self.pending_timeout_s = pending_timeout_s
        self.metrics = metrics
        self.engine: Engine | None = None
        self.load_error: str | None = None
        self.failed: str | None = None
        self.draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._streams: dict[str, RequestStream] = {}
        self._admitted = 0  # tickets not yet released (preparing, waiting or running)
        self._free_lanes = self.max_concurrency
        self._engine_lanes = 0  # requests the engine runs (a lane and their context pages)
        self._waiters: deque[asyncio.Future[bool]] = deque()
        self._loaded = asyncio.Event()
        #: request id -> when the engine took it, until its first token (engine thread only)
        self._accepted: dict[str, float] = {}
        #: the engine's speculative totals at the last post (engine thread only)
        self._spec_seen: SpecStats | None = None
        #: the engine's pool counters at the last post (engine thread only)
        self._memory_seen: dict[str, int] = {}
        #: the prefix cache's (queried, hit) token totals at the last post (engine thread only)
        self._lookups_seen = (0, 0)
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
    def running(self) -> int:
        return self.max_concurrency - self._free_lanes

    @property
    def waiting(self) -> int:
        return self._admitted - self.running

    async def drain(self, timeout: float) -> None:
        """Refuse new work and fail the queued requests (503), let running requests finish for
        up to ``timeout`` s, then cancel the rest and wait for the engine to end them.

        Idempotent. The server drains before it waits for open connections, so every request
        gets its answer from here rather than being cut off by the ASGI server.
        """
        self.draining = True
        self.metrics.set_ready(False)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(False)
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
            self._open_lanes(choose_lanes(self._lane_setting, engine))
        self.engine = engine
        self.load_error = error
        self.metrics.set_ready(engine is not None)
        self._loaded.set()
        if self.on_loaded is not None:
            self.on_loaded(engine, error)

    def _open_lanes(self, choice: LaneChoice) -> None:
        """Set the lanes before the first request: none is admitted while loading."""
        assert self._admitted == 0
        self.lane_choice = choice
        self.max_concurrency = self._free_lanes = choice.lanes
        self.metrics.set_max_concurrency(choice.lanes)

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
        """A ticket for a new request, or ``Overloaded`` when running + waiting is full."""
        self.check_available()
        if self._admitted >= self.max_concurrency + self.max_pending:
            self.metrics.rejected("overloaded")
            raise Overloaded(
                f"the server is at capacity ({self.max_concurrency} running, "
                f"{self.max_pending} waiting); retry later"
            )
        now = time.perf_counter()
        self._admitted += 1
        self._gauges()
        return Ticket(arrival=now, deadline=now + self.pending_timeout_s)

    async def acquire_lane(self, ticket: Ticket) -> None:
        """Wait (FIFO) for a decode lane until the ticket's deadline (``EngineUnavailable``
        when the server starts shutting down meanwhile)."""
        self.check_available()
        if self._free_lanes > 0 and not self._waiters:
            self._free_lanes -= 1
            ticket.has_lane = True
            self._gauges()
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
        self._gauges()

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
        self._gauges()

    def _gauges(self) -> None:
        self.metrics.set_queue(self.running, self.waiting, min(self._engine_lanes, self._admitted))

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

    def _dispatch(
        self,
        batch: dict[str, Chunk],
        lanes: int,
        context_usage: float,
        spec_gained: SpecStats | None,
        memory_gained: dict[str, int],
        lookups: tuple[int, int] | None,
        pool_bytes: dict[str, int],
        host_bytes: int,
        checkpoints: dict[str, int] | None = None,
    ) -> None:
        self._engine_lanes = lanes
        # the streams first: nothing a counter does may keep their tokens from them
        for rid, chunk in batch.items():
            stream = self._streams.get(rid)
            if stream is None:
                continue
            stream._deliver(chunk)
            if chunk.last:
                del self._streams[rid]
                self.release(stream.ticket)
        self.metrics.set_lanes(lanes, context_usage, pool_bytes, host_bytes)
        if spec_gained is not None:
            self.metrics.speculated(spec_gained)
        if memory_gained:
            self.metrics.memory(memory_gained)
        if lookups is not None:
            self.metrics.looked_up(*lookups)
        if checkpoints is not None:
            self.metrics.set_checkpoints(checkpoints)
        self._gauges()

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
        spec_gained = self._spec_gained(engine.spec_stats)
        memory_gained = self._memory_gained(engine)
        lookups = self._lookups_gained(engine)
        if batch or spec_gained is not None or memory_gained or lookups is not None:
            stamp = time.perf_counter()
            for chunk in batch.values():
                chunk.stamp = stamp
            self._post(
                self._dispatch,
                batch,
                engine.lanes_in_use,
                engine.context_usage,
                spec_gained,
                memory_gained,
                lookups,
                engine.pool_bytes(),
                engine.host_bytes,
                engine.cache.checkpoint_counts() if engine.cache is not None else None,
            )

    def _memory_gained(self, engine: Engine) -> dict[str, int]:
        """The engine's pool and media-cache counters' increments since the previous call
        (only those that moved)."""
        totals = {
            "cache_evictions": engine.cache.stats.evictions if engine.cache is not None else 0,
            "preemptions": engine.preemptions,
            "replayed_tokens": engine.replayed_tokens,
        }
        media = getattr(engine, "media_cache", None)  # None: the model takes no images
        if media is not None:
            totals["media_cache_hits"] = media.stats.hits
            totals["media_cache_misses"] = media.stats.misses
            totals["media_cache_evictions"] = media.stats.evictions
        offload = getattr(engine, "expert_offload", None)  # None: no --vram-budget
        if offload is not None:
            totals.update(offload.counters.totals())
        gained = {k: v - self._memory_seen.get(k, 0) for k, v in totals.items()}
        self._memory_seen = totals
        return {k: v for k, v in gained.items() if v}

    def _lookups_gained(self, engine: Engine) -> tuple[int, int] | None:
        """The prompt tokens the engine's prefix cache was asked for and those it resumed
        since the previous call (None: no lookup, or no cache). The engine counts them when
        it admits a request, the one moment it knows how much of the prompt is cached."""
        if engine.cache is None:
            return None
        stats = engine.cache.stats
        seen_queried, seen_hit = self._lookups_seen
        if stats.queried_tokens == seen_queried:
            return None
        self._lookups_seen = (stats.queried_tokens, stats.hit_tokens)
        return stats.queried_tokens - seen_queried, stats.hit_tokens - seen_hit

    def _spec_gained(self, totals: SpecStats | None) -> SpecStats | None:
        """What the engine's speculative ``totals`` gained since the previous call (None:
        nothing, or no speculation). Counters move by these increments, so every round is
        counted once however the steps and the posts interleave."""
        if totals is None:
            return None
        seen = self._spec_seen or SpecStats(totals.draft_tokens)
        if (totals.rounds, totals.fallbacks) == (seen.rounds, seen.fallbacks):
            return None
        self._spec_seen = copy.deepcopy(totals)
        per_position = zip(totals.accepted_per_position, seen.accepted_per_position, strict=True)
        return SpecStats(
            totals.draft_tokens,
            rounds=totals.rounds - seen.rounds,
            fallbacks=totals.fallbacks - seen.fallbacks,
            drafted=totals.drafted - seen.drafted,
            accepted=totals.accepted - seen.accepted,
            accepted_per_position=[now - before for now, before in per_position],
        )
