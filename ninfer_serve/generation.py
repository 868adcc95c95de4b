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
against the context: no token is longer than the vocabulary's longest, so a prompt whose text
needs more tokens than the context holds, even at that length each, is refused at once instead
of after tokenizing it all (the tokenizer holds the GIL, so a huge prompt would stall every
other request meanwhile). A prompt that fits the context but never the context pool is refused
after tokenizing, before a lane is taken: a streamed request gets its 400 before any event.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, Literal, TypeVar

from ninfer_runtime.engine import (
    CacheBoundary,
    Finished,
    GenerationRequest,
    PromptLogprobs,
    TokenEvent,
)
from ninfer_runtime.errors import RequestError
from ninfer_runtime.frontend import (
    OutputAccumulator,
    ParsedOutput,
    ParseEvent,
    SamplingParams,
    TextDelta,
    ToolCallEnd,
)

from .admission import EngineUnavailable, Ticket
from .cache_boundaries import Breakpoint, conversation_boundaries, token_breakpoints
from .effort import Effort, template_effort
from .engine_loop import EngineLoop
from .image_reader import ImageLimits, ImageReader
from .images import split_images
from .request_stream import RequestStream
from .structured import AnswerGrammar, Constraints

__all__ = ["Generator", "Job", "Outcome", "Run", "ToolChoice"]

T = TypeVar("T")
ToolChoice = Literal["auto", "none", "required"] | str  # a str other than those: a named tool

#: roles whose content a chat template writes into the prompt verbatim (an assistant turn's
#: reasoning may be dropped from history, so assistant text is not counted)
_VERBATIM_ROLES = frozenset({"system", "developer", "user", "tool"})
#: how much Unicode normalization can shrink UTF-8 text (NFC composing three Hangul jamo
#: into one syllable: 9 bytes to 3), so the bound holds for normalizing tokenizers too
_NORMALIZATION_SHRINK = 3


def _verbatim_bytes(messages: list[dict[str, Any]]) -> int:
    """UTF-8 bytes of the message text the template renders as given."""
    total = 0
    for message in messages:
        if message.get("role") not in _VERBATIM_ROLES:
            continue
        content = message.get("content")
        parts = content if isinstance(content, list) else [content]
        for part in parts:
            text = part.get("text") if isinstance(part, dict) else part
            if isinstance(text, str):
                total += len(text.encode("utf-8"))
    return total


def _tool_bytes(tools: list[dict[str, Any]] | None) -> int:
    """UTF-8 bytes of the strings (names, descriptions, schema keys and values) in tool
    definitions: a template writes each tool as JSON, which holds them all, escaped (never
    shorter). Walked without recursion: a parameter schema may nest a thousand levels."""
    total = 0
    stack: list[Any] = list(tools or [])
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            total += len(node.encode("utf-8"))
        elif isinstance(node, dict):
            stack.extend(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return total


def _widened(
    encode: Callable[[str], list[int]], prompt: list[int], pad: int
) -> Callable[[str], list[int]]:
    """``encode`` with the k-th image placeholder of its tokens widened to the k-th image's
    run of placeholders in ``prompt`` (the engine's render, images widened): a rendered
    prefix of the conversation then counts its images as the prompt does, without decoding
    the images again."""
    runs = [len(list(run)) for is_pad, run in groupby(prompt, lambda t: t == pad) if is_pad]

    def widened(text: str) -> list[int]:
        out: list[int] = []
        seen = 0
        for token in encode(text):
            if token == pad and seen < len(runs):
                out += [pad] * runs[seen]
                seen += 1
            else:
                out.append(token)
        return out

    return widened


def _context_exceeded(limit: int, tokens: str, param: str) -> RequestError:
    return RequestError(
        f"This model's maximum context length is {limit} tokens. However, your prompt has "
        f"{tokens} tokens (prompt plus at least one generated token must fit). Please shorten "
        f"the {param}.",
        param=param,
        code="context_length_exceeded",
    )


@dataclass
class Job:
    """One generation request, in no particular API's terms: a conversation in ``messages``
    (rendered with the chat template), or a raw ``prompt`` text or ``prompt_ids`` (taken as
    they are, ``messages`` then empty)."""

    messages: list[dict[str, Any]]
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    #: off: the output is plain text (no reasoning or tool-call parsing), as raw completions are
    parse_output: bool = True
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    #: ``None`` (free text), ``{}`` (any JSON object) or a JSON schema
    json_schema: Mapping[str, Any] | None = None
    json_schema_param: str = "response_format"
    #: a regex, choice or grammar the whole answer follows (at most one of it and json_schema)
    answer_grammar: AnswerGrammar | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    enable_thinking: bool | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None
    #: the effort level asked for; a template with levels of its own takes it (``effort``)
    reasoning_effort: Effort | None = None
    continue_final_message: bool = False
    #: off: the prompt ends after the last message, without the assistant turn's opening
    add_generation_prompt: bool = True
    #: text the reply starts with, before anything generated (vLLM's chat ``echo``)
    echo: str = ""
    #: the request field the conversation comes from (an over-long prompt's error names it)
    prompt_param: str = "messages"
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: the prefix-cache namespace (``cache_isolation.cache_salt``); ``cache_shared`` off: no
    #: other request can read this one's entries, so it keeps no checkpoints at its seams
    cache_salt: str | None = None
    cache_shared: bool = True
    #: places the client marked for the prefix cache: in the conversation, or (a raw
    #: prompt) as token counts
    cache_breakpoints: list[Breakpoint] = field(default_factory=list)
    token_breakpoints: list[int] = field(default_factory=list)


@dataclass
class Outcome:
    """How a generation ended, with everything a final response or usage block needs."""

    finish_reason: Literal["stop", "length", "tool_calls", "cancelled"]
    stop_value: int | str | None
    stop_kind: str | None
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    #: speculative decoding: drafted tokens verification kept / turned down (0 without it)
    accepted_draft_tokens: int
    rejected_draft_tokens: int
    prompt_seconds: float
    decode_seconds: float
    context_exhausted: bool
    output: ParsedOutput

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def timings(self) -> dict[str, Any]:
        """llama.cpp's ``timings`` block (tools that read llama-server responses use it)."""
        predicted = max(self.completion_tokens - 1, 0)
        return {
            "cache_n": self.cached_tokens,
            "prompt_n": self.prompt_tokens - self.cached_tokens,
            "prompt_ms": round(self.prompt_seconds * 1000, 3),
            "predicted_n": self.completion_tokens,
            "predicted_ms": round(self.decode_seconds * 1000, 3),
            "predicted_per_second": (
                round(predicted / self.decode_seconds, 3) if self.decode_seconds > 0 else None
            ),
        }


def _blamed(exc: RequestError, params: list[str | None], prompt_param: str) -> RequestError:
    """``exc``, an engine error about the request's images, naming the client's field: the
    engine names an image by its place in ``GenerationRequest.images`` (``images[i]``), or
    all of them (``images``: their count or tokens, or a model that takes none), which is
    the conversation's field (``messages``, ``input``)."""
    param = exc.param or ""
    field: str | None = prompt_param
    if param.startswith("images[") and "]" in param:
        digits = param[len("images[") : param.index("]")]
        index = int(digits) if digits.isdigit() else len(params)
        field = params[index] if index < len(params) else None
    if field is None:
        return exc
    message = str(exc)
    if field != prompt_param and not message.startswith(field):
        message = f"{field}: {message}"
    return RequestError(message, param=field, code=exc.code)


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
        text = _verbatim_bytes(job.messages) + len((job.prompt or "").encode("utf-8"))
        tools = _tool_bytes(job.tools) if job.tool_choice != "none" else 0
        shortest = (text + tools) // (self._longest_token_bytes() * _NORMALIZATION_SHRINK)
        if shortest >= limit:
            param = "tools" if tools > text else job.prompt_param
            raise _context_exceeded(limit, f"at least {shortest}", param)

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
            raise _blamed(exc, split_images(job.messages)[2], job.prompt_param) from None

    def check_length(self, tokens: int, param: str) -> None:
        """Refuse a prompt of ``tokens`` tokens that leaves no room for one generated token,
        in the context or in the whole context pool (the engine would refuse it only once
        submitted)."""
        engine = self.engine
        limit = engine.max_context
        if tokens >= limit:
            raise _context_exceeded(limit, str(tokens), param)
        if tokens >= engine.pool_tokens:
            raise RequestError(
                f"the prompt has {tokens} tokens; the context pool holds {engine.pool_tokens} "
                "in all (prompt plus at least one generated token must fit)",
                param=param,
                code="context_length_exceeded",
            )

    def prepare(self, job: Job) -> tuple[GenerationRequest, tuple[list[int], bool]]:
        """Render, check the context budget and build the grammar (CPU work, no lane)."""
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
        return request, (ids, opened)

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
            encode = _widened(encode, ids, engine.vision.image_token_id)
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
        ticket = self.loop.admit()
        try:
            await self.images.read(job.messages)
            return await asyncio.to_thread(self._count, job)
        finally:
            self.loop.release(ticket)

    async def tokens(self, job: Job) -> list[int]:
        """Prompt token ids of ``job``, its images read and widened (``/tokenize``: admitted,
        no lane, no engine time)."""
        ticket = self.loop.admit()
        try:
            await self.images.read(job.messages)
            return await asyncio.to_thread(self.prompt_ids, job)
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
            request, rendered = await asyncio.to_thread(self.prepare, job)
            await self.loop.acquire_lane(ticket)
            stream = self.loop.submit(ticket, request, rendered)
            submitted = True
            return Run(self, job, stream, len(rendered[0]), self.keepalive)
        except asyncio.CancelledError:  # the client left while the request was queued
            self.loop.metrics.left_before_start()
            raise
        finally:
            if not submitted:
                self.loop.release(ticket)
