"""OpenAI wire models for the request fields Chat Completions and Completions share: sampling,
vLLM's extensions (what they mean is decided in ``vllm_fields.py``) and stream options; and
Completions' ``prompt_cache_options`` (its request model is in ``completion_request.py``).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, WithJsonSchema

from ninfer_runtime.frontend.sampling import MIN_REPETITION_PENALTY

from ..cache_boundaries import MAX_CACHE_BREAKPOINTS
from ..cache_isolation import MAX_CACHE_SALT
from ..errors import invalid_request
from ..limits import MAX_CHOICES, MAX_STOP
from .wire_base import NOT_FALSE, NOT_TRUE, UNSET, ClosedModel, OpenModel, nullable

__all__ = [
    "PromptCacheOptions",
    "SamplingRequest",
    "StreamOptions",
    "StructuredOutputs",
    "VllmGenerationFields",
]

_NONEMPTY = {"type": "string", "minLength": 1}
_STOP = nullable(
    {"anyOf": [_NONEMPTY, {"type": "array", "items": _NONEMPTY, "maxItems": MAX_STOP}]}
)


class StreamOptions(OpenModel):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class StructuredOutputs(ClosedModel):
    """vLLM's ``structured_outputs``: one constraint on the answer (``vllm_fields.py``)."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1, max_length=MAX_CHOICES)
    grammar: str | None = None
    json_object: bool | None = None
    #: there is one grammar engine and no fallback: either value is what happens
    disable_fallback: bool | None = None
    # refused by name when set (they would change the result)
    whitespace_pattern: Annotated[str | None, UNSET] = None
    structural_tag: Annotated[str | dict[str, Any] | None, UNSET] = None
    disable_any_whitespace: Annotated[bool | None, NOT_TRUE] = None
    disable_additional_properties: Annotated[bool | None, NOT_TRUE] = None


class VllmGenerationFields(OpenModel):
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
    guided_whitespace_pattern: Annotated[str | None, UNSET] = None
    structural_tag: Annotated[str | dict[str, Any] | None, UNSET] = None
    allowed_token_ids: Annotated[list[int] | None, UNSET] = None
    bad_words: Annotated[list[str] | None, nullable({"type": "array", "maxItems": 0})] = None
    length_penalty: Annotated[float | None, WithJsonSchema({"enum": [1, None]})] = None
    truncate_prompt_tokens: Annotated[int | None, UNSET] = None
    spaces_between_special_tokens: Annotated[bool | None, NOT_FALSE] = None
    return_tokens_as_token_ids: Annotated[bool | None, NOT_TRUE] = None
    top_a: Annotated[float | None, WithJsonSchema({"enum": [0, None]})] = None
    typical_p: Annotated[float | None, WithJsonSchema({"enum": [1, None]})] = None
    #: the prefix-cache namespace (``cache_isolation.py``): only requests with the same salt
    #: share cached prefixes
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT)


class PromptCacheOptions(ClosedModel):
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
