"""A Chat Completions request as a protocol-neutral ``Job``: the fields refused by name, the
messages with their ``prompt_cache_breakpoint`` marks, tools and ``tool_choice``,
``response_format``, the reasoning effort and the sampling (vLLM's extensions included)."""

from __future__ import annotations

from typing import Any

from ..cache_boundaries import Breakpoint
from ..errors import ApiError, unsupported_parameter
from ..generation import Job
from ..limits import check_stop_count
from . import vllm_fields
from .content import chat_content
from .models import ChatCompletionRequest
from .reasoning_effort import requested_effort, thinking_for_effort
from .tool_choice import check_tool_choice

__all__ = ["cache_breakpoints", "to_job"]


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
