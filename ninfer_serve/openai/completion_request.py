"""The ``POST /v1/completions`` request: its model, the fields refused by name, and its prompts
read into token ids.

A prompt is raw text or token ids, one prompt or a list of them (``prompt_forms``); each is
checked item by item so that an error names ``prompt[2][7]`` precisely, then tokenized once and
checked against the vocabulary and the context (``read_prompts``) before anything is generated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import ConfigDict, Field, WithJsonSchema

from ninfer_runtime.frontend.sampling import MAX_LOGPROBS

from ..errors import invalid_request, shown, unsupported_parameter
from ..generation import Generator, Job
from ..limits import MAX_SAMPLES
from . import vllm_fields
from .models import PromptCacheOptions, SamplingRequest

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MAX_PROMPTS",
    "CompletionRequest",
    "Prompt",
    "prompt_forms",
    "read_prompts",
    "refuse_unsupported",
]

#: the most prompts in one request
MAX_PROMPTS = 64
#: OpenAI's default ``max_tokens`` for Completions
DEFAULT_MAX_TOKENS = 16

_TEXT = {"type": "string", "minLength": 1}
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_PROMPT = WithJsonSchema(
    {
        "anyOf": [
            _TEXT,
            {"type": "array", "items": _TEXT, "minItems": 1, "maxItems": MAX_PROMPTS},
            _IDS,
            {"type": "array", "items": _IDS, "minItems": 1, "maxItems": MAX_PROMPTS},
        ]
    }
)


class CompletionRequest(SamplingRequest):
    """POST /v1/completions, with vLLM's extensions Chat takes too (``vllm_fields``).
    ``prompt`` is checked item by item in this module, so an error names ``prompt[2][7]``
    precisely."""

    model_config = ConfigDict(strict=True, extra="forbid")

    prompt: Annotated[Any, _PROMPT]
    model: str | None = None
    max_tokens: int | None = Field(DEFAULT_MAX_TOKENS, ge=0)
    n: int = Field(1, ge=1, le=MAX_SAMPLES)
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    user: str | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    # accepted so that setting them is refused by name (they would change the result)
    suffix: Annotated[str | None, WithJsonSchema({"type": "null"})] = None
    best_of: Annotated[int | None, WithJsonSchema({"enum": [1, None]})] = Field(None, ge=1)
    use_beam_search: Annotated[bool | None, WithJsonSchema({"enum": [False, None]})] = None
    logit_bias: Annotated[
        dict[str, float] | None,
        WithJsonSchema(
            {"anyOf": [{"type": "object", "additionalProperties": {"const": 0}}, {"type": "null"}]}
        ),
    ] = None


def refuse_unsupported(body: CompletionRequest) -> None:
    if body.suffix is not None:
        raise unsupported_parameter("suffix", "suffix (insertion) is not supported")
    if body.best_of not in (None, 1):
        raise unsupported_parameter(
            "best_of", "only best_of = 1 is supported; use n for several samples"
        )
    if body.use_beam_search:
        raise unsupported_parameter("use_beam_search", "beam search is not supported")
    if body.logit_bias and any(v != 0 for v in body.logit_bias.values()):
        raise unsupported_parameter("logit_bias", "logit_bias is not supported")
    body.check_stream_options()
    most = body.max_tokens
    if body.min_tokens and most is not None and body.min_tokens > most:
        raise invalid_request(
            f"min_tokens: {body.min_tokens} is more than max_tokens ({most})", "min_tokens"
        )
    vllm_fields.refuse_unsupported(body)


# -- prompts -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """One prompt as the engine takes it: its token ids, and the text ``echo`` shows."""

    ids: list[int]
    text: str
    param: str


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_ids(ids: list[Any], param: str) -> None:
    if not ids:
        raise invalid_request(f"{param}: a prompt of token ids needs at least one id", param)
    for j, token in enumerate(ids):
        if not _is_id(token):
            raise invalid_request(
                f"{param}[{j}]: expected a token id (an integer >= 0), got {shown(token, 40)}",
                f"{param}[{j}]",
            )


_FORMS = "a string, a list of strings, a list of token ids or a list of lists of them"


def prompt_forms(prompt: Any) -> list[tuple[str | list[int], str]]:
    """(text or token ids, the field that names it) for each prompt of the request: a
    string, a list of strings, a list of ids or a list of lists of ids."""
    if not isinstance(prompt, str | list):
        raise invalid_request(f"prompt: expected {_FORMS}, got {shown(prompt, 40)}", "prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise invalid_request("prompt: the prompt is empty", "prompt")
        return [(prompt, "prompt")]
    if not prompt:
        raise invalid_request("prompt: the list of prompts is empty", "prompt")
    first = prompt[0]
    if isinstance(first, int) and not isinstance(first, bool):
        _check_ids(prompt, "prompt")
        return [(prompt, "prompt")]
    if len(prompt) > MAX_PROMPTS:
        raise invalid_request(
            f"prompt: at most {MAX_PROMPTS} prompts in one request, not {len(prompt)}", "prompt"
        )
    forms: list[tuple[str | list[int], str]] = []
    for i, item in enumerate(prompt):
        param = f"prompt[{i}]"
        if isinstance(item, str) and isinstance(first, str):
            if not item:
                raise invalid_request(f"{param}: the prompt is empty", param)
        elif isinstance(item, list) and isinstance(first, list):
            _check_ids(item, param)
        else:
            like = "a string" if isinstance(first, str) else "a list of token ids"
            raise invalid_request(
                f"{param}: expected {like}, as the first prompt is (a prompt is {_FORMS})", param
            )
        forms.append((item, param))
    return forms


def read_prompts(
    generator: Generator, forms: list[tuple[str | list[int], str]], echo: bool
) -> list[Prompt]:
    """Token ids (and echoed text) of every prompt, each checked against the vocabulary
    and the context before anything is generated (worker thread: tokenizer work)."""
    engine = generator.engine
    tokenizer = engine.tokenizer
    vocab = engine.model.config.vocab
    prompts = []
    for form, param in forms:
        if isinstance(form, str):
            generator.check_fits(Job(messages=[], prompt=form, prompt_param=param))
            ids, text = tokenizer.encode(form), form
            if not ids:
                raise invalid_request(f"{param}: the prompt has no tokens", param)
        else:
            ids = form
            outside = next((j for j, t in enumerate(ids) if t >= vocab), None)
            if outside is not None:
                raise invalid_request(
                    f"{param}[{outside}]: token id {ids[outside]} is outside the vocabulary "
                    f"(0..{vocab - 1})",
                    f"{param}[{outside}]",
                )
            text = tokenizer.decode(ids) if echo else ""
        generator.check_length(len(ids), param)
        prompts.append(Prompt(ids, text, param))
    return prompts
