"""The prompts of one legacy Completions request run side by side, each with its ``n`` samples,
never more samples at a time than the server has decode lanes (a long list of prompts waits
for its own lanes instead of filling the admission queue)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..generation import Generator, Job, Run
from ..samples import SampleEvent, Samples

__all__ = ["CompletionBatch", "SampleItem"]

#: (prompt index, one of its samples' events)
SampleItem = tuple[int, SampleEvent]


class CompletionBatch:
    """The prompts of one request, each with its ``n`` samples; a request never runs more
    samples at a time than the server has decode lanes."""

    def __init__(self, generator: Generator, jobs: list[Job], n: int):
        self.generator = generator
        self.jobs = jobs
        self.n = n
        self.samples: list[Samples | None] = [None] * len(jobs)
        self._window = asyncio.Semaphore(max(1, generator.loop.max_concurrency // n))
        self._tasks: list[asyncio.Task[None]] = []
        self._first_started = asyncio.Event()

    async def _prompt(self, p: int, on_item: Callable[[SampleItem], None] | None) -> None:
        async with self._window:
            samples = self.samples[p] = await Samples.start(self.generator, self.jobs[p], self.n)
            if p == 0:
                self._first_started.set()
            async for item in samples.events():
                if on_item is not None:
                    on_item((p, item))

    def start(
        self, on_item: Callable[[SampleItem], None] | None = None
    ) -> list[asyncio.Task[None]]:
        self._tasks = [
            asyncio.ensure_future(self._prompt(p, on_item)) for p in range(len(self.jobs))
        ]
        return self._tasks

    async def first_started(self) -> None:
        """Until the first prompt's samples are submitted, or the error that stopped them:
        what could refuse the request (its sampling, its grammar, a full server) is then
        known before a stream's first byte (the other prompts take the same settings and
        were checked against the vocabulary and the context already)."""
        first = self._tasks[0]
        started = asyncio.ensure_future(self._first_started.wait())
        try:
            await asyncio.wait({first, started}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            started.cancel()
        if not self._first_started.is_set() and first.done() and not first.cancelled():
            error = first.exception()
            if error is not None:
                raise error

    async def run_all(self) -> None:
        """Every prompt's samples to their end; the first failure fails the request."""
        try:
            await asyncio.gather(*self.start())
        finally:
            self.cancel()

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
        for samples in self.samples:
            if samples is not None:
                samples.cancel()

    def run(self, p: int, sample: int) -> Run:
        samples = self.samples[p]
        assert samples is not None
        return samples.runs[sample]
