"""OpenAI wire schemas (requests) for Chat Completions and Responses.

Only shapes live here: what a field may hold, for validation and for the published OpenAPI
schema. What a field means is decided in ``chat.py`` / ``responses.py``. Validation is strict
(no string-to-number coercion), as OpenAI's own API is. Chat ignores unknown top-level fields
(clients send vendor extensions); Responses refuses them (a 400 naming the field), as NInfer does.
Fields that are accepted only to be refused when set (``logit_bias``, ``best_of``, ``audio``
...) are declared so the refusal can name them.

The published OpenAPI schema is generated from these models. Where the protocol module checks a
value itself (so that its refusal names the field and says why), the field's annotation states
the accepted values for the schema (``WithJsonSchema``); rules across fields (a named tool that
must be in ``tools``, content a role needs) cannot be stated and are listed in docs/serve.md.

The models live by request: ``chat_models.py`` (Chat Completions), ``sampling_models.py`` (the
fields Chat shares with Completions), ``response_models.py`` (Responses), on the bases in
``wire_base.py``; this module gathers the ones the protocol modules and routes take.
"""

from __future__ import annotations

from .chat_models import ChatCompletionRequest, ChatMessage, ChatTool
from .response_models import InputTokensRequest, ResponsesRequest
from .sampling_models import (
    PromptCacheOptions,
    SamplingRequest,
    StreamOptions,
    StructuredOutputs,
    VllmGenerationFields,
)

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "ChatTool",
    "InputTokensRequest",
    "PromptCacheOptions",
    "ResponsesRequest",
    "SamplingRequest",
    "StreamOptions",
    "StructuredOutputs",
    "VllmGenerationFields",
]
