"""The one thread that owns the engine: it loads it, takes submissions and cancellations from
a queue, calls ``step()`` while there is work, and posts each step's chunks (one per request)
with the engine's readings to the asyncio loop in one call per step.

The engine is synchronous and not thread-safe, and a GPU backend binds its context to the
thread that loads it, so nothing else touches the engine. A failed step fails every request in
flight and every later one: the engine's state can no longer be trusted.
"""

from __future__ import annotations

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

from .admission import EngineUnavailable
from .engine_readings import CounterGains, Readings
from .request_stream import Chunk

__all__ = ["EngineThread"]

log = logging.getLogger("ninfer_serve")


@dataclass(frozen=True)
class Prepared:
    """A request's prompt as a worker thread made it for the engine: its token ids, whether
    the output starts inside reasoning (``Engine.render``), and where the next chat turn's
    prompt stops being this one's (``Engine.history_end``), so the engine's thread neither
    renders nor tokenizes it again."""

    ids: list[int]
    opened: bool
    history_end: int | None


@dataclass
class _Submit:
    request: GenerationRequest
    prepared: Prepared


@dataclass
class _Cancel:
    request_id: str


class _Stop:
    pass


class EngineThread:
    """The engine's thread. ``post(callback, *args)`` runs a callback on the asyncio loop; the
    thread posts ``on_loaded(engine, error)`` once, ``on_batch(chunks, readings)`` after each
    step (and before it, for a step's first tokens) and ``on_failed(message)`` when a step
    fails."""

    def __init__(
        self,
        load: Callable[[], Engine],
        post: Callable[..., None],
        *,
        on_loaded: Callable[[Engine | None, str | None], None],
        on_batch: Callable[[dict[str, Chunk], Readings], None],
        on_failed: Callable[[str], None],
    ):
        self._load = load
        self._post = post
        self._on_loaded = on_loaded
        self._on_batch = on_batch
        self._on_failed = on_failed
        self._commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        #: request id -> when the engine took it, until its first token (engine thread only)
        self._accepted: dict[str, float] = {}
        #: the engine's counters at the last post (engine thread only)
        self._counters = CounterGains()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="ninfer-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, request: GenerationRequest, prepared: Prepared) -> None:
        self._commands.put(_Submit(request, prepared))

    def cancel(self, request_id: str) -> None:
        self._commands.put(_Cancel(request_id))

    def stop(self, timeout: float) -> None:
        """End the thread (the engine cancels what is in flight) and wait up to ``timeout`` s;
        blocks, so call it off the asyncio loop."""
        self._commands.put(_Stop())
        if self._thread is not None:
            self._thread.join(timeout)

    def _main(self) -> None:
        try:
            engine = self._load()
        except Exception as exc:  # any load failure is reported, not raised in a thread
            message = str(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, EngineError):
                log.error("loading the engine failed:\n%s", traceback.format_exc())
            self._post(self._on_loaded, None, message)
            return
        self._post(self._on_loaded, engine, None)
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
                        prepared = command.prepared
                        engine.submit(
                            command.request,
                            rendered=(prepared.ids, prepared.opened),
                            history_end=prepared.history_end,
                        )
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
                    self._post(self._on_failed, failed)
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
            self._post(self._on_batch, batch, Readings.of(engine, gains))
