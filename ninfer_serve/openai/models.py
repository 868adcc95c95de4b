"""OpenAI wire schemas (requests) for Chat Completions and Responses.

Only shapes live here: what a field may hold, for validation and for the published OpenAPI
schema. What a field means is decided in ``chat.py`` / ``responses.py``. Validation is strict
(no string-to-number coercion), as OpenAI's own API is. Chat ignores unknown top-level fields
(clients send vendor extensions); Responses refuses them (``unknown_parameter``), as NInfer does.
Fields that are accepted only to be refused when set (``n``, ``logit_bias``, ``audio`` ...) are
declared so the refusal can name them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "InputTokensRequest",
    "ResponsesRequest",
]


class _Open(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class _Closed(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


# -- chat completions -----------------------------------------------------------------------------


class FunctionCall(_Open):
    name: str
    arguments: str | dict[str, Any] | None = None


class ToolCall(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDefinition(_Open):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaSpec(_Open):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class StreamOptions(_Open):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class ChatCompletionRequest(_Open):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    enable_thinking: bool | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    max_thinking_tokens: int | None = Field(None, ge=1)
    # accepted so that setting them is refused by name (they would change the result)
    n: int | None = Field(None, ge=1)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    # accepted and without effect on the result
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None


# -- responses ------------------------------------------------------------------------------------


class FunctionTool(_Closed):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunctionChoice(_Closed):
    type: Literal["function"]
    name: str


class TextFormat(_Closed):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Closed):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(_Closed):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(_Closed):
    """POST /v1/responses. ``input`` items are checked item by item in ``responses.py`` so an
    error can name ``input[3].content`` precisely."""

    model: str | None = None
    input: str | list[dict[str, Any]]
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
    truncation: Literal["disabled", "auto"] | None = None
    background: bool | None = None
    include: list[str] | None = None
    service_tier: str | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    client_metadata: dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None
    top_logprobs: int | None = Field(None, ge=0)


class InputTokensRequest(_Closed):
    """POST /v1/responses/input_tokens: the prompt-defining subset of a Responses request."""

    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    truncation: Literal["disabled", "auto"] | None = None
    conversation: str | dict[str, Any] | None = None
