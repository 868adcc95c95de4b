"""The streamed reply of legacy Completions: SSE chunks of every prompt's samples interleaved
as they come, a choice's echoed prompt first, then its text with the log-probabilities of the
tokens that came with it, then its finish."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ninfer_runtime.frontend import TextDelta

from ..http import KEEPALIVE, sse_data
from ..samples import SampleEvent
from .chunk_stream import DONE, StreamUsage, failed_stream_end
from .completion_batch import CompletionBatch, SampleItem
from .completion_output import ChoiceShaper
from .finish_reasons import stop_reason
from .models import StreamOptions

__all__ = ["CompletionStream"]


@dataclass
class _Streamed:
    """What a streamed choice has sent so far."""

    started: bool = False
    tokens: int = 0  # generated tokens whose log-probabilities went out
    offset: int = 0  # characters of the choice's text so far (``text_offset``)


class CompletionStream:
    """The SSE chunks of a streamed request, the choices interleaved as they come."""

    def __init__(
        self,
        batch: CompletionBatch,
        shaper: ChoiceShaper,
        base: dict[str, Any],
        options: StreamOptions | None,
        keepalive: float,
    ):
        self.batch = batch
        self.shaper = shaper
        self.base = base
        self.usage = StreamUsage.asked(options)
        self.keepalive = keepalive
        self.queue: asyncio.Queue[SampleItem | BaseException] = asyncio.Queue()
        self.sent: dict[tuple[int, int], _Streamed] = {}

    def _chunk(
        self, p: int, sample: int, text: str, logprobs: Any, finish: str | None = None
    ) -> bytes:
        run = self.batch.run(p, sample)
        item = {
            "index": p * self.shaper.n + sample,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish,
            "stop_reason": None,
        }
        if finish is not None and self.shaper.generates:
            assert run.outcome is not None
            item["stop_reason"] = stop_reason(run.outcome)
        payload: dict[str, Any] = {**self.base, "choices": [item]}
        completion = len(run.tokens) if self.shaper.generates else 0
        self.usage.stamp(payload, len(self.shaper.prompts[p].ids), completion)
        return sse_data(payload)

    def _frames(self, p: int, item: SampleEvent) -> list[bytes]:
        """The chunks one sample event makes: the choice's echo first (once), then its new
        text with the log-probabilities of the tokens that came with it, or its end."""
        shaper, sample = self.shaper, item.index
        sent = self.sent.setdefault((p, sample), _Streamed())
        out = []
        if not sent.started:
            sent.started = True
            if shaper.echo:
                text = shaper.prompts[p].text
                logprobs = shaper.logprobs_of(shaper.echoed(self.batch, p), 0)
                out.append(self._chunk(p, sample, text, logprobs))
                sent.offset += len(text)
        text = item.event.text if isinstance(item.event, TextDelta) and shaper.generates else ""
        finish = None
        if item.done:
            outcome = self.batch.run(p, sample).outcome
            assert outcome is not None
            finish = shaper.finish(outcome)
        items = shaper.generated(self.batch.run(p, sample), sent.tokens, item.tokens)
        sent.tokens = item.tokens
        if text or items or finish is not None:
            logprobs = shaper.logprobs_of(items, sent.offset) if items else None
            out.append(self._chunk(p, sample, text, logprobs, finish))
            sent.offset += len(text)
        return out

    def begin(self) -> None:
        """Start the choices; their events wait in the queue until ``frames`` reads them."""

        def failed(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and task.exception() is not None:
                self.queue.put_nowait(task.exception())  # type: ignore[arg-type]

        for task in self.batch.start(self.queue.put_nowait):
            task.add_done_callback(failed)

    async def frames(self) -> AsyncIterator[bytes]:
        left = len(self.batch.jobs) * self.shaper.n
        try:
            while left:
                try:
                    async with asyncio.timeout(self.keepalive):
                        got = await self.queue.get()
                except TimeoutError:
                    yield KEEPALIVE
                    continue
                if isinstance(got, BaseException):  # a choice failed: say so in-band, end
                    for frame in failed_stream_end(got):
                        yield frame
                    return
                p, item = got
                if item.event is None and not item.done:
                    continue  # a sample's silence: the keepalive above covers them all
                left -= item.done
                for frame in self._frames(p, item):
                    yield frame
            if self.usage.include:
                usage = self.shaper.usage(self.batch)
                yield sse_data({**self.base, "choices": [], "usage": usage})
            yield DONE
        finally:
            self.batch.cancel()
