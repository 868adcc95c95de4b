"""A submitted generation: its parse events as they stream, then its ``Outcome``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Literal

from ninfer_runtime.engine import Finished, PromptLogprobs, TokenEvent
from ninfer_runtime.frontend import OutputAccumulator, ParseEvent, TextDelta, ToolCallEnd

from .admission import EngineUnavailable
from .job import Job, Outcome
from .request_stream import RequestStream

if TYPE_CHECKING:
    from .generation import Generator

__all__ = ["Run"]


class Run:
    """A submitted job: iterate ``events()`` for parse events, then read ``outcome``."""

    def __init__(
        self, gen: Generator, job: Job, stream: RequestStream, prompt_tokens: int, keepalive: float
    ):
        self._gen = gen
        self.job = job
        self._stream = stream
        self.prompt_tokens = prompt_tokens
        self._keepalive = keepalive
        self.outcome: Outcome | None = None
        self.created = int(time.time())
        self._accumulator = OutputAccumulator()
        self._truncated = False
        #: the generated tokens so far, with their scores when the job asked for them
        self.tokens: list[TokenEvent] = []
        #: the prompt's scores, once read, when the job asked for them (``prompt_logprobs``)
        self.prompt_logprobs: PromptLogprobs | None = None
        #: set once the engine has read the prompt (its first output or its end): a request
        #: sent with the same prompt after that resumes from its prefix-cache checkpoint
        self.prompt_read = asyncio.Event()

    def cancel(self) -> None:
        self._stream.cancel()

    async def frames(
        self, feed: Callable[[ParseEvent], Iterable[bytes]], keepalive: bytes
    ) -> AsyncIterator[bytes]:
        """The stream frames ``feed`` makes of each event, and ``keepalive`` for each silence."""
        async for event in self.events():
            if event is None:
                yield keepalive
            else:
                for data in feed(event):
                    yield data

    async def events(self) -> AsyncIterator[ParseEvent | None]:
        """Parse events as they come; ``None`` marks ``keepalive`` seconds of silence.

        With ``parallel_tool_calls`` off, the reply ends after the first complete call: the
        engine request is cancelled there and later events are dropped.
        """
        single = not self.job.parallel_tool_calls
        finished: Finished | None = None
        try:
            if self.job.echo:
                echoed = TextDelta(self.job.echo)
                self._accumulator.add([echoed])
                yield echoed
            async for chunk in self._stream.chunks(self._keepalive):
                if chunk is None:
                    yield None
                    continue
                self.prompt_read.set()
                if chunk.error is not None:
                    raise chunk.error
                self.tokens.extend(chunk.token_events)
                if chunk.prompt_logprobs is not None:
                    self.prompt_logprobs = chunk.prompt_logprobs
                for event in chunk.events:
                    if self._truncated:
                        break
                    self._accumulator.add([event])
                    yield event
                    if isinstance(event, ToolCallEnd) and single:
                        self._truncated = True
                        self._stream.ended_early = True
                        self._stream.cancel()
                finished = chunk.finished
        finally:
            if finished is None:
                self._stream.cancel()  # the consumer went away (client disconnect)
        assert finished is not None
        if (
            finished.reason == "cancelled"
            and not self._stream.ended_early
            and self._gen.loop.draining
        ):
            raise EngineUnavailable("the server shut down before the request finished")
        self.outcome = self._outcome(finished)

    async def collect(self) -> Outcome:
        """Run to the end (non-streaming responses)."""
        async for _ in self.events():
            pass
        assert self.outcome is not None
        return self.outcome

    def _outcome(self, f: Finished) -> Outcome:
        output = self._accumulator.result()
        reason: Literal["stop", "length", "tool_calls", "cancelled"]
        complete_calls = output.tool_calls and not any(c.cut_off for c in output.tool_calls)
        if self._truncated or (f.reason == "stop" and complete_calls):
            reason = "tool_calls"
        elif f.reason in ("stop", "length", "cancelled"):
            reason = f.reason  # type: ignore[assignment]
        else:
            reason = "stop"
        usage = f.usage
        return Outcome(
            finish_reason=reason,
            stop_value=f.stop.value if f.stop is not None else None,
            stop_kind=f.stop.kind if f.stop is not None else None,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            cached_tokens=usage.cached_tokens,
            accepted_draft_tokens=usage.accepted_draft_tokens,
            rejected_draft_tokens=usage.rejected_draft_tokens,
            prompt_seconds=f.prompt_seconds,
            decode_seconds=f.decode_seconds,
            context_exhausted=usage.prompt_tokens + usage.completion_tokens
            >= self._gen.max_context,
            output=output,
        )
