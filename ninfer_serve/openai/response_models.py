"""OpenAI wire models for Responses (``POST /v1/responses`` and
``/v1/responses/input_tokens``). What a field means is decided in ``response_request.py``;
``input`` items are read one by one in ``response_items.py`` so that an error names
``input[3].content``, and only their accepted shapes are stated here, for the schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema

from ninfer_runtime.frontend.sampling import MAX_LOGPROBS

from ..cache_isolation import MAX_CACHE_SALT
from .wire_base import UNSET, ClosedModel, nullable

__all__ = ["InputTokensRequest", "ResponsesRequest"]


class FunctionTool(ClosedModel):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunctionChoice(ClosedModel):
    type: Literal["function"]
    name: str


class TextFormat(ClosedModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(ClosedModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(ClosedModel):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


def _string_fields(*names: str) -> dict[str, Any]:
    return {name: {"type": "string"} for name in names}


_PARTS = {
    "type": "array",
    "items": {"type": "object", "properties": _string_fields("text"), "required": ["text"]},
}
_INPUT_TEXT_PART = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "type": {"enum": ["input_text", "output_text", "text"]},
                "text": {"type": "string"},
            },
            "required": ["type", "text"],
        },
        {
            "type": "object",
            "properties": {"type": {"const": "refusal"}, "refusal": {"type": "string"}},
            "required": ["type", "refusal"],
        },
    ]
}
_INPUT_TEXT = {"anyOf": [{"type": "string"}, {"type": "array", "items": _INPUT_TEXT_PART}]}
#: the input items ``response_items.py`` reads (a message's ``type`` may be left out)
_INPUT_ITEM = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "type": {"const": "message"},
                "role": {"enum": ["user", "assistant", "system", "developer"]},
                "content": _INPUT_TEXT,
            },
            "required": ["role", "content"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "function_call"},
                "name": {"type": "string", "minLength": 1},
            }
            | _string_fields("call_id", "arguments"),
            "required": ["type", "call_id", "name", "arguments"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "function_call_output"},
                "call_id": {"type": "string"},
                "output": _INPUT_TEXT,
            },
            "required": ["type", "call_id", "output"],
        },
        {
            "type": "object",
            "properties": {"type": {"const": "reasoning"}, "content": _PARTS, "summary": _PARTS},
            "required": ["type"],
        },
    ]
}
_INPUT = WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": _INPUT_ITEM}]})
_TRUNCATION = WithJsonSchema({"enum": ["disabled", None]})


class ResponsesRequest(ClosedModel):
    """POST /v1/responses. ``input`` items are checked item by item in ``responses.py`` so an
    error can name ``input[3].content`` precisely."""

    model: str | None = None
    input: Annotated[str | list[dict[str, Any]], _INPUT]
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    max_thinking_tokens: int | None = Field(None, ge=1)
    stream: bool | None = False
    store: bool | None = True
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    metadata: dict[str, str] | None = Field(None, max_length=16)
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(None, ge=1)
    truncation: Annotated[Literal["disabled", "auto"] | None, _TRUNCATION] = None
    background: Annotated[bool | None, WithJsonSchema({"enum": [False, None]})] = None
    include: list[str] | None = None
    service_tier: str | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    client_metadata: dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None
    #: alternatives per token; the scores come with ``include``'s
    #: ``message.output_text.logprobs`` (``response_request.py`` refuses them without it)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    #: the prefix-cache namespace, as Chat's (``cache_isolation.py``)
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT)


class InputTokensRequest(ClosedModel):
    """POST /v1/responses/input_tokens: the prompt-defining subset of a Responses request."""

    model: str | None = None
    input: Annotated[str | list[dict[str, Any]] | None, nullable(_INPUT.json_schema)] = None
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    truncation: Annotated[Literal["disabled", "auto"] | None, _TRUNCATION] = None
    conversation: Annotated[str | dict[str, Any] | None, UNSET] = None
