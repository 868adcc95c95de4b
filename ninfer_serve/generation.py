"""The engine adapter every front door shares: a protocol-neutral ``Job`` in, events out.

The OpenAI Chat, OpenAI Responses and Anthropic Messages handlers each translate their wire
request into a ``Job`` and translate the events back; admission, prompt rendering, sampling
defaults, constrained decoding, tool-choice policy and usage accounting happen here once, so the
three APIs cannot drift apart in behaviour.

Order of work for a request (NInfer's): take an admission ticket (429 when full; the pending
deadline starts now), prepare the prompt and grammar in a worker thread (400 on a bad request),
wait for a decode lane (503 at the deadline), submit to the engine thread, stream. Counting a
prompt's tokens takes a ticket too: it is the same tokenizer work as preparing one.

Before a prompt is rendered and tokenized, its text (messages and tool definitions) is measured
against the context (``prompt_bounds``), so a prompt that could never fit is refused without
tokenizing it. A prompt that fits the context but never the context pool is refused after
tokenizing, before a lane is taken: a streamed request gets its 400 before any event.

The records live beside it (``job``: ``Job``, ``Outcome``; ``run``: ``Run``) and are
re-exported here, where the front doors import them from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ninfer_runtime.engine import CacheBoundary, GenerationRequest
from ninfer_runtime.errors import RequestError
from ninfer_runtime.frontend import SamplingParams

from .admission import Ticket
from .cache_boundaries import conversation_boundaries, token_breakpoints
from .effort import template_effort
from .engine_loop import EngineLoop
from .engine_thread import Prepared
from .image_reader import ImageLimits, ImageReader
from .images import split_images
from .job import Job, Outcome, ToolChoice
from .prompt_bounds import NORMALIZATION_SHRINK, context_exceeded, tool_bytes, verbatim_bytes
from .prompt_images import blamed, widened
from .run import Run
from .structured import Constraints

__all__ = ["Generator", "Job", "Outcome", "Run", "ToolChoice"]

T = TypeVar("T")


class Generator:
    """Turns jobs into runs on one engine loop."""

    def __init__(
        self,
        loop: EngineLoop,
        *,
        default_max_tokens: int | None,
        enable_thinking: bool | None,
        keepalive: float,
        images: ImageLimits | None = None,
    ):
        self.loop = loop
        self.images = ImageReader(images or ImageLimits())
        self.default_max_tokens = default_max_tokens
        self.enable_thinking = enable_thinking
        self.keepalive = keepalive
        self._constraints: Constraints | None = None
        self._longest_token: int | None = None

    @property
    def engine(self) -> Any:
        self.loop.check_available()
        return self.loop.engine

    @property
    def max_context(self) -> int:
        engine = self.loop.engine
        return engine.max_context if engine is not None else 0

    def _constraints_for(self) -> Constraints:
        if self._constraints is None:
            self._constraints = Constraints(self.engine)
        return self._constraints

    # -- preparation (worker thread) ------------------------------------------------------------

    def _request(self, job: Job) -> GenerationRequest:
        engine = self.engine
        fields = dict(job.sampling)
        kwargs, drop_budget = template_effort(
            job.reasoning_effort, engine.template.chat_format, job.chat_template_kwargs
        )
        if drop_budget:
            fields["max_thinking_tokens"] = None
        if fields.get("max_tokens") is None:
            fields["max_tokens"] = self.default_max_tokens
        try:
            sampling = SamplingParams.resolve(engine.tokenizer.generation_defaults, **fields)
        except TypeError as exc:  # an adapter passed a field SamplingParams does not know
            raise RequestError(str(exc)) from None
        if job.prompt is not None or job.prompt_ids is not None:
            return GenerationRequest(
                prompt=job.prompt,
                prompt_ids=job.prompt_ids,
                sampling=sampling,
                parse_output=job.parse_output,
                request_id=job.request_id,
            )
        tools = job.tools if job.tool_choice != "none" else None
        messages, images, _ = split_images(job.messages)
        return GenerationRequest(
            messages=messages,
            images=images,
            tools=tools or None,
            enable_thinking=self.thinking(job.enable_thinking, kwargs),
            chat_template_kwargs=kwargs,
            continue_final_message=job.continue_final_message,
            add_generation_prompt=job.add_generation_prompt,
            sampling=sampling,
            parse_tool_calls=job.tool_choice != "none",
            request_id=job.request_id,
        )

    def thinking(self, given: bool | None, kwargs: Mapping[str, Any] | None) -> bool | None:
        """Whether the template is told to think: the request's choice, else the server's
        default, unless the request's ``chat_template_kwargs`` set ``enable_thinking``."""
        if given is None and not (kwargs and "enable_thinking" in kwargs):
            return self.enable_thinking
        return given

    def _longest_token_bytes(self) -> int:
        if self._longest_token is None:
            tokenizer = self.engine.tokenizer
            sizes = (len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size))
            self._longest_token = max(1, *sizes)
        return self._longest_token

    def check_fits(self, job: Job) -> None:
        """Refuse a prompt whose text alone needs more tokens than the context holds."""
        limit = self.engine.max_context
        text = verbatim_bytes(job.messages) + len((job.prompt or "").encode("utf-8"))
        tools = tool_bytes(job.tools) if job.tool_choice != "none" else 0
        shortest = (text + tools) // (self._longest_token_bytes() * NORMALIZATION_SHRINK)
        if shortest >= limit:
            param = "tools" if tools > text else job.prompt_param
            raise context_exceeded(limit, f"at least {shortest}", param)

    def _count(self, job: Job) -> int:
        self.check_fits(job)
        return len(self.prompt_ids(job))

    def prompt_ids(self, job: Job) -> list[int]:
        """``job``'s prompt token ids as generation renders them, each image widened to its
        tokens (worker thread; the images read already)."""
        ids, _ = self._render(job, self._request(job))
        return ids

    def _render(self, job: Job, request: GenerationRequest) -> tuple[list[int], bool]:
        """The prompt's token ids (images as their placeholder tokens); an image the engine
        refuses is blamed on the client field it came from."""
        try:
            return self.engine.render(request)
        except RequestError as exc:
            if not (exc.param or "").startswith("images"):
                raise
            raise blamed(exc, split_images(job.messages)[2], job.prompt_param) from None

    def check_length(self, tokens: int, param: str) -> None:
        """Refuse a prompt of ``tokens`` tokens that leaves no room for one generated token,
        in the context or in the whole context pool (the engine would refuse it only once
        submitted)."""
        engine = self.engine
        limit = engine.max_context
        if tokens >= limit:
            raise context_exceeded(limit, str(tokens), param)
        if tokens >= engine.pool_tokens:
            raise RequestError(
                f"the prompt has {tokens} tokens; the context pool holds {engine.pool_tokens} "
                "in all (prompt plus at least one generated token must fit)",
                param=param,
                code="context_length_exceeded",
            )

    def prepare(self, job: Job) -> tuple[GenerationRequest, Prepared]:
        """Render, check the context budget, find where the prompt's cache checkpoints go
        and build the grammar (CPU work, no lane)."""
        self.check_fits(job)
        request = self._request(job)
        engine = self.engine
        ids, opened = self._render(job, request)
        self.check_length(len(ids), job.prompt_param)
        request.cache_salt = job.cache_salt
        if job.cache_shared and engine.cache is not None:
            request.cache_boundaries = self._boundaries(job, request, ids)
        grammar = None
        if job.tool_choice not in ("auto", "none") and job.tools:
            only = None if job.tool_choice == "required" else job.tool_choice
            grammar = self._constraints_for().tool_grammar(
                job.tools, only, job.parallel_tool_calls, "tool_choice"
            )
            kind = "tool_choice"
        elif job.tool_choice not in ("auto", "none"):
            raise RequestError("tool_choice requires tools", param="tool_choice")
        elif job.json_schema is not None:
            schema = job.json_schema or None
            grammar = self._constraints_for().json_grammar(schema, job.json_schema_param)
            kind = "json_schema" if schema else "json_object"
        elif job.answer_grammar is not None:
            grammar = self._constraints_for().answer_grammar(job.answer_grammar)
            kind = job.answer_grammar.kind
        if grammar is not None:
            request.logits_processor = self._constraints_for().processor(grammar)
            self.loop.metrics.constrained(kind)
        return request, Prepared(ids, opened, engine.history_end(request, ids))

    def _boundaries(
        self, job: Job, request: GenerationRequest, ids: list[int]
    ) -> list[CacheBoundary]:
        """Where other requests are likely to share this prompt up to (``cache_boundaries``)."""
        if request.messages is None:
            return token_breakpoints(job.token_breakpoints, len(ids))
        engine = self.engine

        def render(messages: list[dict[str, Any]]) -> str:
            return engine.template.render(
                messages,
                tools=request.tools,
                add_generation_prompt=False,
                enable_thinking=request.enable_thinking,
                chat_template_kwargs=request.chat_template_kwargs,
            )

        encode = engine.tokenizer.encode
        if request.images:  # a rendered prefix's images take as many tokens as the prompt's
            encode = widened(encode, ids, engine.vision.image_token_id)
        return conversation_boundaries(
            render,
            encode,
            list(request.messages),
            ids,
            has_tools=bool(request.tools),
            breakpoints=job.cache_breakpoints,
        )

    # -- running (event loop) -------------------------------------------------------------------

    async def count(self, job: Job) -> int:
        """Prompt tokens of ``job`` (the count endpoints: admitted, no lane, no engine time)."""
        return await self._rendered(self._count, job)

    async def tokens(self, job: Job) -> list[int]:
        """Prompt token ids of ``job``, its images read and widened (``/tokenize``: admitted,
        no lane, no engine time)."""
        return await self._rendered(self.prompt_ids, job)

    async def _rendered(self, work: Callable[[Job], T], job: Job) -> T:
        """``work(job)`` in a worker thread once ``job``'s images are read, under an admission
        ticket."""
        ticket = self.loop.admit()
        try:
            await self.images.read(job.messages)
            return await asyncio.to_thread(work, job)
        finally:
            self.loop.release(ticket)

    async def admitted(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` in a worker thread under an admission ticket (tokenizer work:
        counted against the server's capacity, no lane, no engine time)."""
        ticket = self.loop.admit()
        try:
            return await asyncio.to_thread(work, *args)
        finally:
            self.loop.release(ticket)

    async def start(self, job: Job) -> Run:
        """Admit, prepare, wait for a lane and submit; errors are raised before any output."""
        ticket: Ticket = self.loop.admit()
        submitted = False
        try:
            await self.images.read(job.messages)
            request, prepared = await asyncio.to_thread(self.prepare, job)
            await self.loop.acquire_lane(ticket)
            stream = self.loop.submit(ticket, request, prepared)
            submitted = True
            return Run(self, job, stream, len(prepared.ids), self.keepalive)
        except asyncio.CancelledError:  # the client left while the request was queued
            self.loop.metrics.left_before_start()
            raise
        finally:
            if not submitted:
                self.loop.release(ticket)
