"""OpenAI wire models for Chat Completions (``POST /v1/chat/completions``): messages, tools,
tool choice, response format and the request itself. What a field means is decided in
``chat.py``; the sampling fields it shares with Completions are in ``sampling_models.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema

from ninfer_runtime.frontend.sampling import MAX_LOGPROBS

from ..limits import MAX_SAMPLES, MAX_TEMPLATE_KWARGS
from .sampling_models import SamplingRequest
from .wire_base import UNSET, OpenModel, nullable

__all__ = ["ChatCompletionRequest", "ChatMessage", "ChatTool"]


#: a Chat message's content: a string or text parts. ``image_url`` parts (``content.py``)
#: are left out: whether one is valid (a decodable image, a model and template that take
#: images) cannot be stated here
_CHAT_CONTENT = nullable(
    {
        "anyOf": [
            {"type": "string"},
            {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                    "required": ["type", "text"],
                },
            },
        ]
    }
)


#: chat_template_kwargs: at most MAX_TEMPLATE_KWARGS entries (``vllm_fields.py`` bounds its size)
_TEMPLATE_KWARGS = nullable({"type": "object", "maxProperties": MAX_TEMPLATE_KWARGS})


class FunctionCall(OpenModel):
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] | None = None


class ToolCall(OpenModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(OpenModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[str | list[dict[str, Any]] | None, _CHAT_CONTENT] = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    #: a hint for the prefix cache: keep a checkpoint after this message (a text part may
    #: carry it too: after that part), since later requests repeat the prompt up to here
    prompt_cache_breakpoint: bool | None = None


class FunctionDefinition(OpenModel):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(OpenModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenModel):
    name: str


class NamedToolChoice(OpenModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaSpec(OpenModel):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[ChatTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: Annotated[dict[str, Any] | None, _TEMPLATE_KWARGS] = None
    # vLLM's chat extensions (``chat.py``): the reply continues the last message, or follows it
    # with or without the template's assistant opening, and may start with its text
    continue_final_message: bool | None = None
    add_generation_prompt: bool | None = None
    echo: bool | None = None
    enable_thinking: bool | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    max_thinking_tokens: int | None = Field(None, ge=1)
    #: independent samples, at most the server's lanes (``limits.check_sample_count``)
    n: int | None = Field(None, ge=1, le=MAX_SAMPLES)
    logprobs: bool | None = None
    #: needs ``logprobs: true`` (``chat.py`` refuses it alone, as OpenAI does)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    # accepted so that setting them is refused by name (they would change the result)
    logit_bias: Annotated[
        dict[str, float] | None, nullable({"type": "object", "additionalProperties": {"const": 0}})
    ] = None
    best_of: Annotated[int | None, WithJsonSchema({"enum": [1, None]})] = Field(None, ge=1)
    use_beam_search: Annotated[bool | None, WithJsonSchema({"enum": [False, None]})] = None
    audio: Annotated[dict[str, Any] | None, UNSET] = None
    modalities: Annotated[
        list[str] | None, nullable({"type": "array", "items": {"const": "text"}})
    ] = None
    prediction: Annotated[dict[str, Any] | None, UNSET] = None
    web_search_options: Annotated[dict[str, Any] | None, UNSET] = None
    functions: Annotated[list[dict[str, Any]] | None, UNSET] = None
    function_call: Annotated[str | dict[str, Any] | None, UNSET] = None
    # accepted and without effect on the result
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
