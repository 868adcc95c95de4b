"""POST /v1/completions: OpenAI's legacy Completions, as vLLM serves them.

A prompt is raw text (no chat template) or token ids, one prompt or a list of them; each
gets ``n`` independent samples, the choices indexed prompt by prompt, then sample by sample.
The output is plain text: no reasoning or tool-call parsing. The request model and the
reading of its prompts are in ``completion_request``; this module runs and shapes them.

The samples of one prompt share its prefill (``samples.Samples``: the first is submitted
alone, the others once the engine has read the prompt, resuming from its prefix-cache
checkpoint); ``n`` is at most the server's decode lanes. Each prompt is tokenized once, and
all are checked (vocabulary, context) before anything is generated. A request never runs more
samples at a time than the server has lanes, so a long list of prompts waits for its own
lanes instead of filling the admission queue. Usage counts each prompt once:
``prompt_tokens`` over the prompts, ``cached_tokens`` what the cache held for them before
the request (the first samples'), and ``completion_tokens`` over every choice.

``echo`` puts the prompt's text before each choice's text; with ``logprobs`` the prompt's
tokens come first in the choice's log-probabilities (the first one's null: nothing predicts
it), scored once by the prompt's first sample (``prompt_logprobs``). ``max_tokens: 0``
generates nothing (the engine samples one token, which is dropped): with ``echo`` and
``logprobs`` that scores a prompt, as evaluation harnesses do. vLLM's extensions are Chat's
(``vllm_fields``: guided decoding, ``min_tokens``, ``ignore_eos`` ...). Fields the engine
cannot honour (``suffix``, ``best_of`` above 1, beam search, a non-zero ``logit_bias``) are
refused with a 400 that names them; unknown fields are refused too. A streamed request's
first prompt is submitted before the stream opens, so what would refuse the request comes
as its status, not inside a 200 stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from litestar import Request, Response
from litestar.response import Stream

from ninfer_runtime.frontend import TextDelta

from ..cache_isolation import isolate
from ..errors import from_exception
from ..generation import Generator, Job, Outcome, Run
from ..http import KEEPALIVE, ServerState, new_id, sse_data, sse_response, until_disconnect
from ..limits import check_sample_count, check_stop_count
from ..samples import SampleEvent, Samples
from . import vllm_fields
from .completion_request import (
    MAX_PROMPTS,
    CompletionRequest,
    Prompt,
    prompt_forms,
    read_prompts,
    refuse_unsupported,
)
from .logprobs import Scored, completion_logprobs, prompt_scored, scored
from .models import StreamOptions

__all__ = ["MAX_PROMPTS", "CompletionRequest", "create_completion"]

# -- choices -------------------------------------------------------------------------------------


def _job(body: CompletionRequest, prompt: Prompt, answer: vllm_fields.AnswerConstraint) -> Job:
    """The job of one prompt (``samples.Samples`` makes its ``n`` samples)."""
    return Job(
        messages=[],
        prompt_ids=prompt.ids,
        parse_output=False,
        prompt_param=prompt.param,
        json_schema=answer.json_schema,
        json_schema_param=answer.json_param,
        answer_grammar=answer.grammar,
        cache_salt=body.cache_salt,
        token_breakpoints=(
            list(body.prompt_cache_options.breakpoints) if body.prompt_cache_options else []
        ),
        sampling={
            # nothing to generate: the engine samples one token (it always takes a step),
            # which is dropped
            "max_tokens": 1 if body.max_tokens == 0 else body.max_tokens,
            **body.sampling(),
            **vllm_fields.sampling_fields(body),
            "logprobs": body.logprobs,
            "prompt_logprobs": body.logprobs if body.echo else None,
        },
    )


#: (prompt index, one of its samples' events)
_Item = tuple[int, SampleEvent]


class _Batch:
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

    async def _prompt(self, p: int, on_item: Callable[[_Item], None] | None) -> None:
        async with self._window:
            samples = self.samples[p] = await Samples.start(self.generator, self.jobs[p], self.n)
            if p == 0:
                self._first_started.set()
            async for item in samples.events():
                if on_item is not None:
                    on_item((p, item))

    def start(self, on_item: Callable[[_Item], None] | None = None) -> list[asyncio.Task[None]]:
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


# -- responses -----------------------------------------------------------------------------------


class _Shaper:
    """Builds one request's choices, chunks and usage from its runs."""

    def __init__(self, body: CompletionRequest, tokenizer: Any, prompts: list[Prompt]):
        self.echo = bool(body.echo)
        self.logprobs = body.logprobs
        self.generates = body.max_tokens != 0
        self.n = body.n
        self.tokenizer = tokenizer
        self.prompts = prompts

    def logprobs_of(self, items: list[Scored], text_offset: int) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        shaped = completion_logprobs(self.tokenizer, items, text_offset)
        # as OpenAI's: the chosen token is among its position's alternatives (logprobs + 1
        # of them at most)
        for token, value, top in zip(
            shaped["tokens"], shaped["token_logprobs"], shaped["top_logprobs"], strict=True
        ):
            if top is not None:
                top.setdefault(token, value)
        return shaped

    def echoed(self, batch: _Batch, p: int) -> list[Scored]:
        """The prompt's scored tokens for an echo with logprobs (its first sample's)."""
        if not (self.echo and self.logprobs is not None):
            return []
        scores = batch.run(p, 0).prompt_logprobs
        assert scores is not None
        return prompt_scored(scores)

    def generated(self, run: Run, start: int = 0, end: int | None = None) -> list[Scored]:
        return scored(run.tokens[start:end]) if self.generates else []

    def choice(self, batch: _Batch, p: int, sample: int) -> dict[str, Any]:
        run = batch.run(p, sample)
        outcome = run.outcome
        assert outcome is not None
        text = self.prompts[p].text if self.echo else ""
        if self.generates:
            text += outcome.output.content
        return {
            "index": p * self.n + sample,
            "text": text,
            "logprobs": self.logprobs_of(self.echoed(batch, p) + self.generated(run), 0),
            "finish_reason": self.finish(outcome),
            "stop_reason": _stop_reason(outcome) if self.generates else None,
        }

    def finish(self, outcome: Outcome) -> str:
        if not self.generates:
            return "length"
        return "length" if outcome.finish_reason == "length" else "stop"

    def usage(self, batch: _Batch) -> dict[str, Any]:
        """Each prompt once (the cache held ``cached_tokens`` of them before the request:
        its first samples'), the generated tokens of every choice."""
        prompt_tokens = sum(len(p.ids) for p in self.prompts)
        completion = cached = 0
        for p in range(len(self.prompts)):
            for sample in range(self.n):
                outcome = batch.run(p, sample).outcome
                assert outcome is not None
                completion += outcome.completion_tokens if self.generates else 0
                cached += outcome.cached_tokens if sample == 0 else 0
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }


def _stop_reason(outcome: Outcome) -> int | str | None:
    """vLLM's ``stop_reason``: the stop string or stop token id that ended the output."""
    return outcome.stop_value if outcome.stop_kind in ("stop_string", "stop_token") else None


@dataclass
class _Streamed:
    """What a streamed choice has sent so far."""

    started: bool = False
    tokens: int = 0  # generated tokens whose log-probabilities went out
    offset: int = 0  # characters of the choice's text so far (``text_offset``)


class _Stream:
    """The SSE chunks of a streamed request, the choices interleaved as they come."""

    def __init__(
        self,
        batch: _Batch,
        shaper: _Shaper,
        base: dict[str, Any],
        options: StreamOptions | None,
        keepalive: float,
    ):
        self.batch = batch
        self.shaper = shaper
        self.base = base
        self.include_usage = bool(options and options.include_usage)
        self.continuous_usage = bool(options and options.continuous_usage_stats)
        self.keepalive = keepalive
        self.queue: asyncio.Queue[_Item | BaseException] = asyncio.Queue()
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
            item["stop_reason"] = _stop_reason(run.outcome)
        payload: dict[str, Any] = {**self.base, "choices": [item]}
        if self.continuous_usage:
            prompt = len(self.shaper.prompts[p].ids)
            completion = len(run.tokens) if self.shaper.generates else 0
            payload["usage"] = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
        elif self.include_usage:
            payload["usage"] = None
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
                    _, body = from_exception(got).openai()
                    yield sse_data(body)
                    yield b"data: [DONE]\n\n"
                    return
                p, item = got
                if item.event is None and not item.done:
                    continue  # a sample's silence: the keepalive above covers them all
                left -= item.done
                for frame in self._frames(p, item):
                    yield frame
            if self.include_usage:
                usage = self.shaper.usage(self.batch)
                yield sse_data({**self.base, "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"
        finally:
            self.batch.cancel()


async def create_completion(
    state: ServerState, request: Request[Any, Any, Any], body: CompletionRequest
) -> Response[Any] | Stream:
    model = state.check_model(body.model)
    refuse_unsupported(body)
    check_stop_count(body.stop, "stop")
    answer = vllm_fields.answer_constraint(body)
    generator = state.generator
    state.loop.check_available()  # the lanes are known once the engine is loaded
    check_sample_count(body.n, generator.loop.max_concurrency)
    forms = prompt_forms(body.prompt)
    prompts = await until_disconnect(
        request, generator.admitted(read_prompts, generator, forms, bool(body.echo))
    )
    shaper = _Shaper(body, generator.engine.tokenizer, prompts)
    jobs = [_job(body, p, answer) for p in prompts]
    for job in jobs:
        isolate(job, state.settings.context_cache.isolation, request.headers)
    batch = _Batch(generator, jobs, body.n)
    created = int(time.time())
    base = {"id": new_id("cmpl-"), "object": "text_completion", "created": created, "model": model}
    if body.stream:
        stream = _Stream(batch, shaper, base, body.stream_options, generator.keepalive)
        stream.begin()
        try:
            await until_disconnect(request, batch.first_started())
        except BaseException:
            batch.cancel()
            raise
        return sse_response(stream.frames(), batch.cancel)
    await until_disconnect(request, batch.run_all())
    choices = [shaper.choice(batch, p, i) for p in range(len(prompts)) for i in range(body.n)]
    return Response({**base, "choices": choices, "usage": shaper.usage(batch)})
