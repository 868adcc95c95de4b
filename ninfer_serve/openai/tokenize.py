"""POST /tokenize and /detokenize, in vLLM's shapes.

``/tokenize`` takes a ``prompt`` (raw text, as ``/v1/completions`` reads it) or chat
``messages`` (rendered with the chat template as ``/v1/chat/completions`` renders them, the
server's thinking default included) and answers the token ids, their count and the context
(``max_model_len``); ``return_token_strs`` adds each token's vocabulary string.
``add_special_tokens`` (by default on for a prompt, off for messages, whose template writes
its special tokens itself) lets the tokenizer add what its post-processor adds (a BOS, for
models that have one). Messages with images (``image_url`` parts, read as chat reads them)
are rendered as generation renders them: each image's placeholder widened to the image's
tokens, so ``count`` is the ``prompt_tokens`` a chat request would report (with
``add_special_tokens`` they are refused). ``/detokenize`` turns ids back into text, special
tokens included.

Both are tokenizer work: admitted like any request (429 at capacity), run in a worker
thread, no lane, no engine time.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, WithJsonSchema

from ..errors import invalid_request
from ..generation import Generator, Job
from ..http import ServerState
from ..images import image_parts
from ..limits import MAX_TEMPLATE_KWARGS
from ..wire import WireModel
from .content import chat_content
from .models import ChatMessage, ChatTool
from .vllm_fields import check_template_kwargs, prompt_ending

__all__ = ["DetokenizeRequest", "TokenizeRequest", "detokenize", "tokenize"]


class TokenizeRequest(WireModel):
    """POST /tokenize: exactly one of ``prompt`` and ``messages``; the template's fields
    only with ``messages``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    tools: list[ChatTool] | None = None
    chat_template_kwargs: Annotated[
        dict[str, Any] | None,
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "object", "maxProperties": MAX_TEMPLATE_KWARGS},
                    {"type": "null"},
                ]
            }
        ),
    ] = None
    return_token_strs: bool | None = False


class DetokenizeRequest(WireModel):
    """POST /detokenize."""

    model_config = ConfigDict(strict=True, extra="forbid")

    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


#: the fields that shape a chat template's rendering, refused beside a raw ``prompt``
_TEMPLATE_FIELDS = (
    "add_generation_prompt",
    "continue_final_message",
    "tools",
    "chat_template_kwargs",
)


def _check_form(body: TokenizeRequest) -> None:
    if (body.prompt is None) == (body.messages is None):
        both = ", not both" if body.prompt is not None else ""
        raise invalid_request(f"prompt: give either prompt or messages{both}", "prompt")
    if body.prompt is not None:
        for name in _TEMPLATE_FIELDS:
            if getattr(body, name) is not None:
                raise invalid_request(
                    f"{name}: only with messages (a prompt is tokenized as it is)", name
                )
    else:
        check_template_kwargs(body.chat_template_kwargs)
        prompt_ending(body)


def _tools(body: TokenizeRequest) -> list[dict[str, Any]] | None:
    return [t.model_dump(exclude_none=True, by_alias=True) for t in body.tools or []] or None


def _image_job(body: TokenizeRequest, messages: list[dict[str, Any]]) -> Job:
    """The chat job whose prompt the messages with images make (rendered by the generator,
    as a chat request's is)."""
    if body.add_special_tokens:
        raise invalid_request(
            "add_special_tokens: not with image parts (the template writes the special tokens)",
            "add_special_tokens",
        )
    continuing, generation_prompt = prompt_ending(body)
    return Job(
        messages=messages,
        tools=_tools(body),
        chat_template_kwargs=body.chat_template_kwargs,
        continue_final_message=continuing,
        add_generation_prompt=generation_prompt,
    )


def _encode(
    generator: Generator, body: TokenizeRequest, messages: list[dict[str, Any]] | None = None
) -> list[int]:
    """The token ids of the request's prompt or of its text-only messages (``messages``:
    them as dumped and checked, else dumped here) (worker thread)."""
    engine = generator.engine
    if body.prompt is not None:
        text, special = body.prompt, body.add_special_tokens is not False
    else:
        if messages is None:
            messages = [m.model_dump(exclude_none=True) for m in body.messages or []]
        kwargs = body.chat_template_kwargs
        continuing, generation_prompt = prompt_ending(body)
        tools = _tools(body)
        text = engine.template.render(
            messages,
            tools=tools,
            add_generation_prompt=generation_prompt,
            continue_final_message=continuing,
            enable_thinking=generator.thinking(None, kwargs),
            chat_template_kwargs=kwargs,
        )
        special = bool(body.add_special_tokens)
    if not special:
        return engine.tokenizer.encode(text)
    (encoding,) = engine.tokenizer.backend.encode_batch([text], add_special_tokens=True)
    return list(encoding.ids)


async def tokenize(state: ServerState, body: TokenizeRequest) -> dict[str, Any]:
    state.check_model(body.model)
    _check_form(body)
    generator = state.generator
    messages = None
    if body.messages is not None:
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        chat_content(messages)  # image_url parts become image parts; other media are refused
    if messages is not None and image_parts(messages):
        ids = await generator.tokens(_image_job(body, messages))
    else:
        ids = await generator.admitted(_encode, generator, body, messages)
    answer: dict[str, Any] = {
        "count": len(ids),
        "max_model_len": state.settings.engine.max_context,
        "tokens": ids,
        "token_strs": None,
    }
    if body.return_token_strs:
        tokenizer = generator.engine.tokenizer
        answer["token_strs"] = [tokenizer.id_to_token(t) or "" for t in ids]
    return answer


def _decode(generator: Generator, ids: list[int]) -> str:
    tokenizer = generator.engine.tokenizer
    vocab = tokenizer.vocab_size
    outside = next((i for i, t in enumerate(ids) if t >= vocab), None)
    if outside is not None:
        raise invalid_request(
            f"tokens[{outside}]: token id {ids[outside]} is outside the vocabulary "
            f"(0..{vocab - 1})",
            "tokens",
        )
    return tokenizer.decode(ids)


async def detokenize(state: ServerState, body: DetokenizeRequest) -> dict[str, Any]:
    state.check_model(body.model)
    generator = state.generator
    return {"prompt": await generator.admitted(_decode, generator, body.tokens)}
