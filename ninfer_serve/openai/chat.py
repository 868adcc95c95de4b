"""POST /v1/chat/completions: OpenAI Chat Completions on the shared engine adapter.

Behaviour follows OpenAI where OpenAI defines it and vLLM where it extends it (``top_k``,
``min_p``, ``repetition_penalty``, ``stop_token_ids``, ``ignore_eos``, ``chat_template_kwargs``,
``reasoning_content``, ``stop_reason``). Fields that would change the result but cannot be
honoured (``logit_bias``, ``best_of``, beam search, audio, predicted outputs, legacy functions)
are refused with a 400 that names them instead of being ignored.

``n`` samples run as separate engine requests (``samples.Samples``: they share the prompt's
prefill), each a choice with its own index. With ``logprobs`` a choice lists every token it
generated, reasoning and tool-call markup included (as vLLM does): their ``bytes`` joined are
the text the model wrote before it was split into ``reasoning_content``, ``content`` and
``tool_calls``. A streamed chunk carries the tokens generated since the previous chunk of its
choice, so the chunks' lists joined are the non-streamed list.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response
from litestar.response import Stream

from ninfer_runtime.frontend import (
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

from ..cache_boundaries import Breakpoint
from ..cache_isolation import isolate
from ..effort import Effort
from ..errors import ApiError, from_exception, unsupported_parameter
from ..generation import Job, Outcome
from ..http import (
    KEEPALIVE,
    ServerState,
    sse_data,
    sse_response,
    until_disconnect,
)
from ..limits import check_sample_count, check_stop_count
from ..samples import SampleEvent, Samples, combined
from . import vllm_fields
from .content import chat_content
from .logprobs import chat_logprobs, scored
from .models import ChatCompletionRequest, StreamOptions
from .tool_choice import check_tool_choice

__all__ = [
    "chat_completions",
    "completion_body",
    "thinking_for_effort",
    "to_job",
    "usage_block",
]

#: ``reasoning_effort`` levels as thinking budgets (tokens of reasoning, ``</think>`` included)
EFFORT_BUDGETS = {"low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768}


def _refuse_unsupported(body: ChatCompletionRequest) -> None:
    if body.logit_bias and any(v != 0 for v in body.logit_bias.values()):
        raise unsupported_parameter("logit_bias", "logit_bias is not supported")
    if body.best_of not in (None, 1):
        raise unsupported_parameter(
            "best_of", "best_of is not supported; n samples are all returned"
        )
    if body.use_beam_search:
        raise unsupported_parameter("use_beam_search", "beam search is not supported")
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(
            400,
            "top_logprobs: needs logprobs set to true",
            code="invalid_value",
            param="top_logprobs",
        )
    if body.audio is not None:
        raise unsupported_parameter("audio", "audio output is not supported")
    if body.modalities and any(m != "text" for m in body.modalities):
        raise unsupported_parameter("modalities", "only the text modality is supported")
    if body.prediction is not None:
        raise unsupported_parameter("prediction", "predicted outputs are not supported")
    if body.web_search_options is not None:
        raise unsupported_parameter("web_search_options", "web search is not supported")
    if body.functions is not None or body.function_call is not None:
        param = "functions" if body.functions is not None else "function_call"
        raise unsupported_parameter(param, "the legacy functions API is not supported; use tools")


def thinking_for_effort(effort: str | None) -> tuple[bool | None, int | None]:
    """(thinking on or off, thinking budget) for a reasoning effort.

    Qwen templates know only thinking on or off, so the levels become budgets
    (``EFFORT_BUDGETS``): ``none``/``minimal`` turn thinking off, absent leaves the defaults.
    A template with effort levels of its own (GLM-5) takes the level instead and the budget
    is dropped when the prompt is rendered (``ninfer_serve.effort``).
    """
    if effort is None:
        return None, None
    if effort in ("none", "minimal"):
        return False, None
    return True, EFFORT_BUDGETS[effort]


def requested_effort(
    effort: str | None, param: str, explicit_budget: int | None, budget: int | None
) -> Effort | None:
    """The job's ``reasoning_effort``: whether its budget came from the effort is kept, so a
    template that takes the level itself can drop that budget (never an explicit one)."""
    if effort is None:
        return None
    return Effort(effort, param, sets_budget=explicit_budget is None and budget is not None)


def to_job(body: ChatCompletionRequest) -> Job:
    """The protocol-neutral job for a validated Chat Completions request."""
    _refuse_unsupported(body)
    body.check_stream_options()
    vllm_fields.refuse_unsupported(body)
    vllm_fields.check_template_kwargs(body.chat_template_kwargs)
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    breakpoints = cache_breakpoints(messages)
    chat_content(messages)
    continue_final, generation_prompt = vllm_fields.prompt_ending(body)
    check_stop_count(body.stop, "stop")
    tools = [t.model_dump(exclude_none=True, by_alias=True) for t in body.tools or []]
    choice = body.tool_choice
    if choice is None:
        tool_choice = "auto" if tools else "none"
    elif isinstance(choice, str):
        tool_choice = choice
    else:
        tool_choice = choice.function.name
    check_tool_choice(tool_choice, tools)
    schema = None
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        schema = {}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise ApiError(
                400,
                "response_format.json_schema.schema is required",
                code="invalid_request",
                param="response_format.json_schema.schema",
            )
        schema = fmt.json_schema.schema_
    where = "response_format" if schema == {} else "response_format.json_schema.schema"
    answer = vllm_fields.answer_constraint(
        body,
        None if schema is None else (schema, where),
        forced_tool=tool_choice not in ("auto", "none"),
    )
    thinking, budget = thinking_for_effort(body.reasoning_effort)
    if body.enable_thinking is not None:
        thinking = body.enable_thinking
    return Job(
        messages=messages,
        tools=tools or None,
        tool_choice=tool_choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        json_schema=answer.json_schema,
        json_schema_param=answer.json_param,
        answer_grammar=answer.grammar,
        sampling={
            "max_tokens": body.max_completion_tokens or body.max_tokens,
            **body.sampling(),
            **vllm_fields.sampling_fields(body),
            "max_thinking_tokens": body.max_thinking_tokens or budget,
            "logprobs": (body.top_logprobs or 0) if body.logprobs else None,
        },
        enable_thinking=thinking,
        chat_template_kwargs=body.chat_template_kwargs,
        reasoning_effort=requested_effort(
            body.reasoning_effort, "reasoning_effort", body.max_thinking_tokens, budget
        ),
        continue_final_message=continue_final,
        add_generation_prompt=generation_prompt,
        echo=vllm_fields.echo_text(messages, generation_prompt) if body.echo else "",
        cache_salt=body.cache_salt,
        cache_breakpoints=breakpoints,
    )


def cache_breakpoints(messages: list[dict[str, Any]]) -> list[Breakpoint]:
    """The places marked ``prompt_cache_breakpoint`` (taken out of the messages, which the
    template then renders as if unmarked): after a message, or after a text part of one
    (the last part's mark: after the message; an image part's: after the image)."""
    found: list[Breakpoint] = []
    for i, message in enumerate(messages):
        at_end = bool(message.pop("prompt_cache_breakpoint", None))
        content = message.get("content")
        parts = content if isinstance(content, list) else []
        offset = 0
        for j, part in enumerate(parts):
            if not isinstance(part, dict):
                continue
            text = part.get("text")
            offset += len(text) if isinstance(text, str) else 0
            if part.pop("prompt_cache_breakpoint", None):
                if j == len(parts) - 1:
                    at_end = True
                else:
                    past = part.get("type") == "image_url"
                    found.append(Breakpoint(i + 1, offset, past_images=past))
        if at_end:
            found.append(Breakpoint(i + 1))
    return found


def usage_block(outcome: Outcome) -> dict[str, Any]:
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": outcome.total_tokens,
        "prompt_tokens_details": {"cached_tokens": outcome.cached_tokens},
        "completion_tokens_details": {
            "reasoning_tokens": outcome.reasoning_tokens,
            "accepted_prediction_tokens": outcome.accepted_draft_tokens,
            "rejected_prediction_tokens": outcome.rejected_draft_tokens,
        },
    }


def _finish(outcome: Outcome) -> str:
    return "stop" if outcome.finish_reason == "cancelled" else outcome.finish_reason


def _stop_reason(outcome: Outcome) -> int | str | None:
    """vLLM's ``stop_reason``: the stop string or stop token id that ended the output."""
    return outcome.stop_value if outcome.stop_kind in ("stop_string", "stop_token") else None


def _message(outcome: Outcome) -> dict[str, Any]:
    out = outcome.output
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in out.tool_calls
    ]
    return {
        "role": "assistant",
        "content": out.content if (out.content or not calls) else None,
        "reasoning_content": out.reasoning or None,
        "tool_calls": calls,
    }


def completion_body(
    cid: str,
    model: str,
    created: int,
    outcomes: list[Outcome],
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The reply: a choice per sample, with its ``logprobs`` object when asked for."""
    choices = [
        {
            "index": i,
            "message": _message(outcome),
            "logprobs": logprobs[i] if logprobs is not None else None,
            "finish_reason": _finish(outcome),
            "stop_reason": _stop_reason(outcome),
        }
        for i, outcome in enumerate(outcomes)
    ]
    total = combined(outcomes)
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage_block(total),
        "timings": total.timings(),
    }


def _delta(event: Any) -> dict[str, Any] | None:
    """A streamed chunk's ``delta`` for a parse event (None: the event shows nothing)."""
    if isinstance(event, TextDelta):
        return {"content": event.text}
    if isinstance(event, ReasoningDelta):
        return {"reasoning_content": event.text}
    if isinstance(event, ToolCallStart):
        call = {
            "index": event.index,
            "id": event.id,
            "type": "function",
            "function": {"name": event.name, "arguments": ""},
        }
        return {"tool_calls": [call]}
    if isinstance(event, ToolCallArgumentsDelta):
        return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}
    return None


async def _chunks(
    cid: str,
    model: str,
    samples: Samples,
    options: StreamOptions | None,
    tokenizer: Any | None,
) -> AsyncIterator[bytes]:
    """The SSE stream; ``tokenizer`` given: each chunk carries its choice's new tokens'
    log-probabilities (those generated since the choice's previous chunk). With
    ``continuous_usage_stats`` each chunk carries its choice's token counts so far."""
    include_usage = bool(options and options.include_usage)
    continuous_usage = bool(options and options.continuous_usage_stats)
    runs = samples.runs
    created = runs[0].created
    base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
    sent = [0] * len(runs)

    def chunk(item: SampleEvent | int, delta: dict[str, Any], **extra: Any) -> bytes:
        index = item if isinstance(item, int) else item.index
        logprobs = None
        if tokenizer is not None and not isinstance(item, int):
            tokens = runs[index].tokens[sent[index] : item.tokens]
            sent[index] = item.tokens
            logprobs = chat_logprobs(tokenizer, scored(tokens)) if tokens else None
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}
        payload = {**base, "choices": [{**choice, **extra}]}
        if continuous_usage:  # the counts as of this chunk (a choice's first has no token)
            prompt = runs[index].prompt_tokens
            generated = 0 if isinstance(item, int) else item.tokens
            payload["usage"] = {
                "prompt_tokens": prompt,
                "completion_tokens": generated,
                "total_tokens": prompt + generated,
            }
        elif include_usage:
            payload["usage"] = None
        return sse_data(payload)

    for index in range(len(runs)):
        yield chunk(index, {"role": "assistant", "content": ""})
    try:
        async for item in samples.events():
            if item.done:
                outcome = runs[item.index].outcome
                assert outcome is not None
                finish = {"finish_reason": _finish(outcome), "stop_reason": _stop_reason(outcome)}
                yield chunk(item, {}, **finish)
            elif item.event is None:
                yield KEEPALIVE
            else:
                delta = _delta(item.event)
                if delta is not None:
                    yield chunk(item, delta)
    except Exception as exc:  # the engine failed mid-stream: say so in-band, then end
        _, body = from_exception(exc).openai()
        yield sse_data(body)
        yield b"data: [DONE]\n\n"
        return
    if include_usage:
        total = combined([run.outcome for run in runs])  # type: ignore[misc]
        # llama.cpp's server ends its stream with its ``timings`` too
        yield sse_data(
            {**base, "choices": [], "usage": usage_block(total), "timings": total.timings()}
        )
    yield b"data: [DONE]\n\n"


async def chat_completions(
    state: ServerState, request: Request[Any, Any, Any], body: ChatCompletionRequest
) -> Response[Any] | Stream:
    model = state.check_model(body.model)
    job = to_job(body)
    isolate(job, state.settings.context_cache.isolation, request.headers)
    n = body.n or 1
    if n > 1:
        state.loop.check_available()  # the lanes are known once the engine is loaded
        check_sample_count(n, state.loop.max_concurrency)
    samples = await until_disconnect(request, Samples.start(state.generator, job, n))
    cid = f"chatcmpl-{samples.job.request_id}"
    tokenizer = state.generator.engine.tokenizer if body.logprobs else None
    if body.stream:
        chunks = _chunks(cid, model, samples, body.stream_options, tokenizer)
        return sse_response(chunks, samples.cancel)
    try:
        outcomes = await until_disconnect(request, samples.collect())
    finally:
        samples.cancel()  # no-op when finished; frees the lanes when the wait was cut short
    logprobs = None
    if tokenizer is not None:
        logprobs = [chat_logprobs(tokenizer, scored(run.tokens)) for run in samples.runs]
    created = samples.runs[0].created
    return Response(completion_body(cid, model, created, outcomes, logprobs))
