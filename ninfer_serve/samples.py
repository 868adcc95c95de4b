"""``n`` independent samples of one job: submitted so that they share the prompt's prefill,
streamed as one sequence of events tagged with the sample's index.

Why the first sample goes alone: the engine looks a prompt up in its prefix cache when it
admits the request, and the prompt's checkpoint (with its last logits) exists only once a
prefill has read it to the end. Samples submitted together would each prefill the whole
prompt; the others are therefore submitted when the first one's prompt is read, and start
generating from its checkpoint at once (``usage.prompt_tokens_details.cached_tokens`` of each
is the whole prompt).

A sample's seed: the request's for sample 0 (so ``n = 1`` and the first of ``n`` samples
agree), and for sample i a seed derived from it and i, so a seeded request is reproducible and
its samples differ. Without a seed each sample draws its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ninfer_runtime.frontend import ParseEvent

from .generation import Generator, Job, Outcome, Run

__all__ = ["SampleEvent", "Samples", "combined", "sample_jobs", "sample_seed"]

#: odd 64-bit constant (the golden ratio's fraction): consecutive indices land far apart
_SEED_STEP = 0x9E3779B97F4A7C15
_SEED_SPACE = 1 << 63


def sample_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample ``index`` of a request seeded with ``seed`` (None: unseeded)."""
    if seed is None or index == 0:
        return seed
    return (seed + index * _SEED_STEP) % _SEED_SPACE


def sample_jobs(job: Job, n: int) -> list[Job]:
    """``job`` as ``n`` samples: sample 0 is ``job`` itself, the others have their own
    request ids and derived seeds. Only sample 0 scores the prompt (``prompt_logprobs``):
    the scores are the same for every sample, and a prompt to score is read from its first
    token, where the others resume from its checkpoint."""
    seed = job.sampling.get("seed")
    return [job] + [
        dataclasses.replace(
            job,
            request_id=uuid.uuid4().hex,
            sampling={**job.sampling, "seed": sample_seed(seed, i), "prompt_logprobs": None},
        )
        for i in range(1, n)
    ]


@dataclass(frozen=True)
class SampleEvent:
    """One parse event of sample ``index`` (``None``: that sample was silent ``keepalive``
    seconds, or with ``done`` it has ended and its ``outcome`` is set); ``tokens``: how many
    of its tokens (``Run.tokens``) have come with this event."""

    index: int
    event: ParseEvent | None
    tokens: int
    done: bool = False


class Samples:
    """Started samples of one job; ``events()`` merges their events as they come."""

    def __init__(self, runs: list[Run]):
        self.runs = runs
        self._queue: asyncio.Queue[SampleEvent | BaseException] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def start(cls, generator: Generator, job: Job, n: int) -> Samples:
        """Admit and submit ``n`` samples (the first, then the rest once its prompt is read);
        an error starting any of them cancels those already running and is raised."""
        jobs = sample_jobs(job, n)
        samples = cls([await generator.start(jobs[0])])
        if n == 1:
            return samples  # read directly by events(): no task, no queue
        try:
            first = samples._follow(0)
            ready = asyncio.ensure_future(samples.runs[0].prompt_read.wait())
            try:
                await asyncio.wait({first, ready}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
            if first.done() and samples.runs[0].outcome is None:
                return samples  # it failed before its prompt was read: events() raises
            await samples._start_rest(generator, jobs[1:])
        except BaseException:
            samples.cancel()
            raise
        for index in range(1, n):
            samples._follow(index)
        return samples

    async def _start_rest(self, generator: Generator, jobs: list[Job]) -> None:
        """Start ``jobs`` at once; every run that started is kept (so that ``cancel`` reaches
        it) even when another failed or this wait is cancelled (the client left)."""
        tasks = [asyncio.ensure_future(generator.start(job)) for job in jobs]
        try:
            await asyncio.wait(tasks)
        finally:
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is None:
                    self.runs.append(task.result())
                else:
                    task.cancel()  # still waiting (for a lane): it gives its place back
        failed = next((t.exception() for t in tasks if t.exception() is not None), None)
        if failed is not None:
            raise failed

    @property
    def job(self) -> Job:
        return self.runs[0].job

    def _follow(self, index: int) -> asyncio.Task[None]:
        task = asyncio.ensure_future(self._pump(index))
        self._tasks.append(task)
        return task

    async def _pump(self, index: int) -> None:
        """Sample ``index``'s events into the queue, then its end or its error."""
        run = self.runs[index]
        try:
            async for event in run.events():
                self._queue.put_nowait(SampleEvent(index, event, len(run.tokens)))
        except BaseException as exc:  # the consumer decides; a cancelled pump is not read
            self._queue.put_nowait(exc)
            return
        self._queue.put_nowait(SampleEvent(index, None, len(run.tokens), done=True))

    def cancel(self) -> None:
        """Stop every sample (client gone, an error, or done); idempotent."""
        for run in self.runs:
            run.cancel()
        for task in self._tasks:
            task.cancel()

    async def events(self) -> AsyncIterator[SampleEvent]:
        """Every sample's events, each sample's in order; the first error ends them all."""
        if len(self.runs) == 1 and not self._tasks:
            run = self.runs[0]
            async for event in run.events():
                yield SampleEvent(0, event, len(run.tokens))
            yield SampleEvent(0, None, len(run.tokens), done=True)
            return
        left = len(self.runs)
        try:
            while left:
                item = await self._queue.get()
                if isinstance(item, BaseException):
                    raise item
                left -= item.done
                yield item
        finally:
            self.cancel()

    async def collect(self) -> list[Outcome]:
        """Run every sample to the end (non-streaming responses): their outcomes in order."""
        async for _ in self.events():
            pass
        outcomes = [run.outcome for run in self.runs]
        assert all(o is not None for o in outcomes)
        return outcomes  # type: ignore[return-value]


def combined(outcomes: list[Outcome]) -> Outcome:
    """The usage of all samples as one outcome: the prompt once (as the first sample read
    it: the others resume from its checkpoint), the generated tokens of every sample."""
    first = outcomes[0]
    return dataclasses.replace(
        first,
        completion_tokens=sum(o.completion_tokens for o in outcomes),
        reasoning_tokens=sum(o.reasoning_tokens for o in outcomes),
        accepted_draft_tokens=sum(o.accepted_draft_tokens for o in outcomes),
        rejected_draft_tokens=sum(o.rejected_draft_tokens for o in outcomes),
        decode_seconds=max(o.decode_seconds for o in outcomes),
    )
