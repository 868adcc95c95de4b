"""What the published OpenAPI document says beyond Litestar's generated one: each route's
error responses in its API's shape, the rules across fields a schema cannot state, the request
bodies' exact schemas (as pydantic validates them), and the SSE answer of a streaming request.
"""

from __future__ import annotations

from typing import Any

from litestar.openapi import ResponseSpec
from litestar.openapi.spec import OpenAPI, OpenAPIMediaType, Reference
from pydantic.json_schema import models_json_schema

from .anthropic.models import CountTokensRequest, MessagesRequest
from .errors import AnthropicErrorBody, OpenAIErrorBody
from .openai.completions import CompletionRequest
from .openai.models import ChatCompletionRequest, InputTokensRequest, ResponsesRequest
from .openai.tokenize import DetokenizeRequest, TokenizeRequest

__all__ = ["GENERATION", "RULES", "complete_the_schema", "error_specs"]

_STATUS = {
    400: "invalid request (the body names the field in param)",
    401: "missing or wrong API key",
    404: "unknown model or response",
    413: "request body over the limit (--max-request-mib)",
    429: "server_overloaded: running and waiting requests at capacity",
    503: "request_queue_timeout, model_loading or service_unavailable",
    504: "Anthropic: no lane within the pending timeout",
    529: "Anthropic: running and waiting requests at capacity",
}
GENERATION = (400, 401, 404, 413, 429, 503)
#: the rules across fields that a request body's schema cannot state (docs/serve.md)
_TOOL_RULE = "a tool_choice naming a tool needs it in tools, one requiring a tool needs tools"
_CONTEXT_RULE = "the rendered prompt must fit the context (tools add several hundred tokens)"
#: image parts are taken though the schemas leave them out (their validity depends on the
#: data and the model)
_IMAGES = " Images, which the schema leaves out, are read as docs/serve.md (Images) says: "
RULES = {
    "chat": f"Also refused: {_TOOL_RULE}; tool_calls only on assistant messages, other roles "
    "need content, an assistant message content, reasoning or tool_calls; json_schema needs its "
    "schema; tool call arguments must be a JSON object; top_logprobs without logprobs true; n "
    f"above the server's decode lanes; stream_options without stream; {_CONTEXT_RULE}."
    f"{_IMAGES}image_url parts in user messages.",
    "responses": f"Also refused: {_TOOL_RULE}; an empty prompt (instructions, history and input "
    "together); function_call arguments that are not a JSON object; top_logprobs above 0 "
    f"without include message.output_text.logprobs; {_CONTEXT_RULE}."
    f"{_IMAGES}input_image parts in user messages and function_call_output output.",
    "completions": "Also refused: the prompts of a list mixing strings and token ids; a token "
    "id outside the vocabulary; n above the server's decode lanes; stream_options without "
    "stream; min_tokens above max_tokens; more than one answer constraint (guided_* and "
    f"structured_outputs); {_CONTEXT_RULE}.",
    "tokenize": "Give prompt or messages, not both; the template's fields "
    "(add_generation_prompt, continue_final_message, tools, chat_template_kwargs) only with "
    "messages, continue_final_message not with add_generation_prompt, image parts not with "
    "add_special_tokens.",
    "messages": f"Also refused: {_TOOL_RULE}; thinking enabled without budget_tokens below "
    "max_tokens; a last assistant message (a prefill) without text; a conversation that maps to "
    f"no message; {_CONTEXT_RULE}."
    f"{_IMAGES}image blocks in user messages and tool_result content.",
}


def error_specs(*statuses: int, anthropic: bool = False) -> dict[int, ResponseSpec]:
    """OpenAPI responses for the errors a route can give, in its API's shape (Anthropic
    clients get 529 and 504 where OpenAI clients get 429 and 503)."""
    if anthropic:
        statuses = tuple({429: 529}.get(s, s) for s in statuses)
        statuses += (504,) if 503 in statuses else ()
    body = AnthropicErrorBody if anthropic else OpenAIErrorBody
    return {s: ResponseSpec(data_container=body, description=_STATUS[s]) for s in statuses}


_REQUEST_MODELS = (
    ChatCompletionRequest,
    CompletionRequest,
    TokenizeRequest,
    DetokenizeRequest,
    ResponsesRequest,
    InputTokensRequest,
    MessagesRequest,
    CountTokensRequest,
)


def _request_body_schemas() -> dict[str, Any]:
    """The request bodies' JSON Schemas as pydantic states them for the models that validate
    them. Litestar's own translation of a model loses constraints (a bound of 0, ``gt``, the
    size of a dict, a field's published-only schema), and a schema laxer than the validation
    promises clients bodies the server refuses."""
    _, schema = models_json_schema(
        [(model, "validation") for model in _REQUEST_MODELS],
        ref_template="#/components/schemas/{model}",
    )
    return schema["$defs"]


_STREAMING = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")


def complete_the_schema(openapi: OpenAPI) -> None:
    """What Litestar's generated document leaves out: the request bodies' exact schemas, and
    the server-sent events a streaming request (``"stream": true``) is answered with."""
    assert openapi.components.schemas is not None and openapi.paths is not None
    openapi.components.schemas.update(_request_body_schemas())
    for path in _STREAMING:
        operation = openapi.paths[path].post
        assert operation is not None and operation.responses is not None
        ok = operation.responses["200"]
        assert not isinstance(ok, Reference) and ok.content is not None
        ok.content["text/event-stream"] = OpenAPIMediaType()  # one JSON object per event
