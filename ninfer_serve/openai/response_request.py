"""A ``POST /v1/responses`` (or ``/v1/responses/input_tokens``) request as a generation job:
the fields refused by name, the prompt (instructions, then the stored conversation of
``previous_response_id``, then ``input``), tools, the text format and sampling.
"""

from __future__ import annotations

from typing import Any

from ..errors import ApiError, invalid_request
from ..generation import Job
from ..http import ServerState
from .models import InputTokensRequest, ResponsesRequest
from .reasoning_effort import requested_effort, thinking_for_effort
from .response_items import input_messages
from .tool_choice import check_tool_choice

__all__ = ["LOGPROBS_INCLUDE", "conversation", "to_job"]

#: the ``include`` value that asks for the output text's log-probabilities
LOGPROBS_INCLUDE = "message.output_text.logprobs"


def _refuse(body: ResponsesRequest | InputTokensRequest) -> None:
    if isinstance(body, ResponsesRequest):
        if body.background:
            raise ApiError(
                400,
                "background: background responses are not supported",
                code="unsupported_parameter",
                param="background",
            )
        if body.top_logprobs and LOGPROBS_INCLUDE not in (body.include or ()):
            raise ApiError(
                400,
                f"top_logprobs: needs include [{LOGPROBS_INCLUDE!r}] (the log-probabilities "
                "come with the output text)",
                code="invalid_value",
                param="top_logprobs",
            )
    if body.truncation == "auto":
        raise ApiError(
            400,
            "truncation: only 'disabled' is supported",
            code="unsupported_value",
            param="truncation",
        )
    if isinstance(body, InputTokensRequest) and body.conversation is not None:
        raise ApiError(
            400,
            "conversation: conversations are not supported",
            code="unsupported_parameter",
            param="conversation",
        )


def conversation(
    state: ServerState, body: ResponsesRequest | InputTokensRequest
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages for the prompt, history to store) for a request."""
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        history = list(
            state.responses.get(body.previous_response_id, "previous_response_id").messages
        )
    history += input_messages(body.input)
    prompt = list(history)
    if body.instructions:
        prompt.insert(0, {"role": "system", "content": body.instructions})
    if not prompt:
        raise invalid_request("input is empty", "input")
    return prompt, history


def to_job(
    state: ServerState, body: ResponsesRequest | InputTokensRequest
) -> tuple[Job, list[dict[str, Any]]]:
    _refuse(body)
    prompt, history = conversation(state, body)
    tools = [
        {"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
        for t in body.tools or []
    ]
    choice = body.tool_choice
    tool_choice = (
        ("auto" if tools else "none")
        if choice is None
        else (choice if isinstance(choice, str) else choice.name)
    )
    check_tool_choice(tool_choice, tools)
    schema = None
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type == "json_object":
        schema = {}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise invalid_request("text.format.schema is required", "text.format.schema")
        schema = fmt.schema_
    effort = body.reasoning.effort if body.reasoning is not None else None
    thinking, budget = thinking_for_effort(effort)
    sampling: dict[str, Any] = {}
    if isinstance(body, ResponsesRequest):
        sampling = {
            "max_thinking_tokens": body.max_thinking_tokens or budget,
            "max_tokens": body.max_output_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "top_k": 0 if body.top_k == -1 else body.top_k,
            "min_p": body.min_p,
            "seed": body.seed,
        }
        if LOGPROBS_INCLUDE in (body.include or ()):
            sampling["logprobs"] = body.top_logprobs or 0
    job = Job(
        messages=prompt,
        tools=tools or None,
        tool_choice=tool_choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        json_schema=schema,
        json_schema_param="text.format.schema",
        sampling=sampling,
        enable_thinking=thinking,
        reasoning_effort=requested_effort(
            effort,
            "reasoning.effort",
            getattr(body, "max_thinking_tokens", None),
            budget,
        ),
        prompt_param="input",
        cache_salt=body.cache_salt if isinstance(body, ResponsesRequest) else None,
    )
    return job, history
