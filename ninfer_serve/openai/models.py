"""OpenAI wire schemas (requests) for Chat Completions and Responses.

Only shapes live here: what a field may hold, for validation and for the published OpenAPI
schema. What a field means is decided in ``chat.py`` / ``responses.py``. Validation is strict
(no string-to-number coercion), as OpenAI's own API is. Chat ignores unknown top-level fields
(clients send vendor extensions); Responses refuses them (``unknown_parameter``), as NInfer does.
Fields that are accepted only to be refused when set (``logit_bias``, ``best_of``, ``audio``
...) are declared so the refusal can name them.

The published OpenAPI schema is generated from these models. Where the protocol module checks a
value itself (so that its refusal names the field and says why), the field's annotation states
the accepted values for the schema (``WithJsonSchema``); rules across fields (a named tool that
must be in ``tools``, content a role needs) cannot be stated and are listed in docs/serve.md.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, WithJsonSchema

from ninfer_runtime.frontend.sampling import MAX_LOGPROBS, MIN_REPETITION_PENALTY

from ..cache_boundaries import MAX_CACHE_BREAKPOINTS
from ..cache_isolation import MAX_CACHE_SALT
from ..errors import invalid_request
from ..limits import MAX_CHOICES, MAX_SAMPLES, MAX_STOP, MAX_TEMPLATE_KWARGS
from ..wire import WireModel

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "InputTokensRequest",
    "PromptCacheOptions",
    "ResponsesRequest",
    "StructuredOutputs",
    "VllmGenerationFields",
]


#: what the schema states for a field that is refused whenever it is set
_UNSET = WithJsonSchema({"type": "null"})
#: ... and for a switch refused when it is on (off)
_NOT_TRUE = WithJsonSchema({"enum": [False, None]})
_NOT_FALSE = WithJsonSchema({"enum": [True, None]})


def _nullable(schema: dict[str, Any]) -> WithJsonSchema:
    return WithJsonSchema({"anyOf": [schema, {"type": "null"}]})


#: a Chat message's content: a string or text parts. ``image_url`` parts (``content.py``)
#: are left out: whether one is valid (a decodable image, a model and template that take
#: images) cannot be stated here
_CHAT_CONTENT = _nullable(
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
_TEMPLATE_KWARGS = _nullable({"type": "object", "maxProperties": MAX_TEMPLATE_KWARGS})

_NONEMPTY = {"type": "string", "minLength": 1}
_STOP = _nullable(
    {"anyOf": [_NONEMPTY, {"type": "array", "items": _NONEMPTY, "maxItems": MAX_STOP}]}
)


class _Open(WireModel):
    model_config = ConfigDict(strict=True, extra="allow")


class _Closed(WireModel):
    model_config = ConfigDict(strict=True, extra="forbid")


# -- chat completions -----------------------------------------------------------------------------


class FunctionCall(_Open):
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] | None = None


class ToolCall(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
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


class StructuredOutputs(_Closed):
    """vLLM's ``structured_outputs``: one constraint on the answer (``vllm_fields.py``)."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1, max_length=MAX_CHOICES)
    grammar: str | None = None
    json_object: bool | None = None
    #: there is one grammar engine and no fallback: either value is what happens
    disable_fallback: bool | None = None
    # refused by name when set (they would change the result)
    whitespace_pattern: Annotated[str | None, _UNSET] = None
    structural_tag: Annotated[str | dict[str, Any] | None, _UNSET] = None
    disable_any_whitespace: Annotated[bool | None, _NOT_TRUE] = None
    disable_additional_properties: Annotated[bool | None, _NOT_TRUE] = None


class VllmGenerationFields(_Open):
    """vLLM's request extensions that Chat Completions and Completions share; what they mean
    is decided in ``vllm_fields.py``."""

    ignore_eos: bool | None = None
    min_tokens: int | None = Field(None, ge=0)
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1, max_length=MAX_CHOICES)
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputs | None = None
    # accepted so that setting them is refused by name (they would change the result); the
    # schema states the values that change nothing
    guided_whitespace_pattern: Annotated[str | None, _UNSET] = None
    structural_tag: Annotated[str | dict[str, Any] | None, _UNSET] = None
    allowed_token_ids: Annotated[list[int] | None, _UNSET] = None
    bad_words: Annotated[list[str] | None, _nullable({"type": "array", "maxItems": 0})] = None
    length_penalty: Annotated[float | None, WithJsonSchema({"enum": [1, None]})] = None
    truncate_prompt_tokens: Annotated[int | None, _UNSET] = None
    spaces_between_special_tokens: Annotated[bool | None, _NOT_FALSE] = None
    return_tokens_as_token_ids: Annotated[bool | None, _NOT_TRUE] = None
    top_a: Annotated[float | None, WithJsonSchema({"enum": [0, None]})] = None
    typical_p: Annotated[float | None, WithJsonSchema({"enum": [1, None]})] = None
    #: the prefix-cache namespace (``cache_isolation.py``): only requests with the same salt
    #: share cached prefixes
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT)


class PromptCacheOptions(_Closed):
    """Completions' ``prompt_cache_options``: a hint for the prefix cache, never a promise.
    ``breakpoints`` are token counts (the prompt's first N tokens; ``/tokenize`` tells where
    a text ends) after which a checkpoint is worth keeping, since later prompts repeat the
    prompt up to there (one long document, then different questions)."""

    breakpoints: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=list, max_length=MAX_CACHE_BREAKPOINTS
    )


class SamplingRequest(VllmGenerationFields):
    """The sampling fields Chat Completions and Completions share."""

    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    # below 0.01 a penalty only overflows the (float32) logits of the tokens already seen
    repetition_penalty: float | None = Field(None, ge=MIN_REPETITION_PENALTY)
    seed: int | None = None
    stop: Annotated[str | list[str] | None, _STOP] = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None

    def check_stream_options(self) -> None:
        """``stream_options`` only beside ``stream: true``, as OpenAI and vLLM have it."""
        if self.stream_options is not None and not self.stream:
            raise invalid_request(
                "stream_options: only allowed with stream: true", "stream_options"
            )

    def sampling(self) -> dict[str, Any]:
        """These fields as the engine's sampling parameters (vLLM's ``top_k: -1`` is off)."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": 0 if self.top_k == -1 else self.top_k,
            "min_p": self.min_p,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "seed": self.seed,
            "stop": self.stop,
            "stop_token_ids": self.stop_token_ids,
        }


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
        dict[str, float] | None, _nullable({"type": "object", "additionalProperties": {"const": 0}})
    ] = None
    best_of: Annotated[int | None, WithJsonSchema({"enum": [1, None]})] = Field(None, ge=1)
    use_beam_search: Annotated[bool | None, WithJsonSchema({"enum": [False, None]})] = None
    audio: Annotated[dict[str, Any] | None, _UNSET] = None
    modalities: Annotated[
        list[str] | None, _nullable({"type": "array", "items": {"const": "text"}})
    ] = None
    prediction: Annotated[dict[str, Any] | None, _UNSET] = None
    web_search_options: Annotated[dict[str, Any] | None, _UNSET] = None
    functions: Annotated[list[dict[str, Any]] | None, _UNSET] = None
    function_call: Annotated[str | dict[str, Any] | None, _UNSET] = None
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
#: the input items ``responses.py`` reads (a message's ``type`` may be left out)
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


class ResponsesRequest(_Closed):
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
    #: ``message.output_text.logprobs`` (``responses.py`` refuses them without it)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    #: the prefix-cache namespace, as Chat's (``cache_isolation.py``)
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT)


class InputTokensRequest(_Closed):
    """POST /v1/responses/input_tokens: the prompt-defining subset of a Responses request."""

    model: str | None = None
    input: Annotated[str | list[dict[str, Any]] | None, _nullable(_INPUT.json_schema)] = None
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    truncation: Annotated[Literal["disabled", "auto"] | None, _TRUNCATION] = None
    conversation: Annotated[str | dict[str, Any] | None, _UNSET] = None
