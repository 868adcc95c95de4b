"""vLLM's request extensions: what each means here, or the 400 that refuses it by name.

Chat Completions and Completions declare the shared fields through
``models.VllmGenerationFields`` and call ``sampling_fields``, ``answer_constraint`` and
``refuse_unsupported`` here, so the two endpoints cannot drift apart; the chat-only fields
(``continue_final_message``, ``add_generation_prompt``, ``echo``, ``chat_template_kwargs``) have
their helpers below too.

Guided decoding (``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``
and the newer ``structured_outputs`` object) goes onto the one constrained-decoding path
(``structured.py``): JSON as ``response_format`` JSON does, the rest as an ``AnswerGrammar``.
One constraint at a time: two given together (or one beside ``response_format``, or beside a
``tool_choice`` that forces a call) are refused naming both, since which one would win is
anybody's guess.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ..errors import ApiError, shown, unsupported_parameter
from ..limits import MAX_TEMPLATE_KWARGS, MAX_TEMPLATE_KWARGS_BYTES
from ..structured import AnswerGrammar
from .models import StructuredOutputs, VllmGenerationFields

__all__ = [
    "AnswerConstraint",
    "answer_constraint",
    "check_template_kwargs",
    "echo_text",
    "prompt_ending",
    "refuse_unsupported",
    "sampling_fields",
]

#: vLLM fields this server does not implement, with the value that changes nothing (``None``:
#: any value set is refused); a request that sets another value gets a 400 naming the field
_REFUSED: dict[str, tuple[Any, str]] = {
    "guided_whitespace_pattern": (None, "JSON whitespace is fixed here (see docs/serve.md)"),
    "structural_tag": (None, "structural tags are not supported"),
    "allowed_token_ids": (None, "allowed_token_ids is not supported"),
    "bad_words": ([], "bad_words is not supported"),
    "length_penalty": (1, "length_penalty applies to beam search, which is not supported"),
    "truncate_prompt_tokens": (None, "prompts are never truncated here"),
    "spaces_between_special_tokens": (True, "special tokens are always joined with spaces"),
    "return_tokens_as_token_ids": (False, "tokens are returned as text"),
    "top_a": (0, "the top_a sampler is not supported"),
    "typical_p": (1, "typical sampling is not supported"),
}
_REFUSED_STRUCTURED: dict[str, tuple[Any, str]] = {
    "whitespace_pattern": (None, "JSON whitespace is fixed here (see docs/serve.md)"),
    "structural_tag": (None, "structural tags are not supported"),
    "disable_any_whitespace": (False, "JSON whitespace is fixed here (see docs/serve.md)"),
    "disable_additional_properties": (False, "additionalProperties is always honoured here"),
}


def refuse_unsupported(body: VllmGenerationFields) -> None:
    """A 400 naming the first vLLM field set to a value this server would not honour."""
    for name, (neutral, why) in _REFUSED.items():
        value = getattr(body, name)
        if value is not None and value != neutral:
            raise unsupported_parameter(name, why)
    options = body.structured_outputs
    if options is not None:
        for name, (neutral, why) in _REFUSED_STRUCTURED.items():
            value = getattr(options, name)
            if value is not None and value != neutral:
                raise unsupported_parameter(f"structured_outputs.{name}", why)


def sampling_fields(body: VllmGenerationFields) -> dict[str, Any]:
    """The vLLM sampling switches, as ``SamplingParams`` fields (``None``: not given)."""
    return {
        "min_tokens": body.min_tokens,
        "ignore_eos": body.ignore_eos,
        "include_stop_str_in_output": body.include_stop_str_in_output,
        "skip_special_tokens": body.skip_special_tokens,
    }


@dataclass(frozen=True)
class AnswerConstraint:
    """What a request constrains its answer to, in ``Job`` terms: JSON (``json_schema``:
    ``{}`` any object, else a schema; ``json_param`` the field it came from) or a grammar."""

    json_schema: Mapping[str, Any] | None = None
    json_param: str = "response_format"
    grammar: AnswerGrammar | None = None


def answer_constraint(
    body: VllmGenerationFields,
    response_format: tuple[Mapping[str, Any], str] | None = None,
    forced_tool: bool = False,
) -> AnswerConstraint:
    """The one constraint a request gives: vLLM's guided fields, ``structured_outputs``, or
    ``response_format`` JSON (``(schema, field)`` when the caller found one). ``forced_tool``:
    ``tool_choice`` forces a call, which is a constraint of its own."""
    given: list[tuple[str, AnswerConstraint]] = []
    if response_format is not None:
        schema, param = response_format
        given.append((param, AnswerConstraint(schema, param)))
    if body.guided_json is not None:
        given.append(("guided_json", _json(body.guided_json, "guided_json")))
    if body.guided_regex is not None:
        given.append(("guided_regex", _grammar("regex", body.guided_regex, "guided_regex")))
    if body.guided_grammar is not None:
        given.append(("guided_grammar", _grammar("grammar", body.guided_grammar, "guided_grammar")))
    if body.guided_choice is not None:
        choices = tuple(body.guided_choice)
        given.append(("guided_choice", _grammar("choice", choices, "guided_choice")))
    if body.structured_outputs is not None:
        given.extend(_structured(body.structured_outputs))
    names = [name for name, _ in given]
    guided = names[1:] if response_format is not None else names
    if forced_tool and guided:  # (response_format beside a forced call: the call is the answer)
        names.append("tool_choice")
    if len(names) > 1:
        raise ApiError(
            400,
            f"{names[0]} and {names[1]} are both given; a request takes one constraint on its "
            "answer at a time",
            code="invalid_request",
            param=names[1],
        )
    return given[0][1] if given else AnswerConstraint()


def _structured(options: StructuredOutputs) -> list[tuple[str, AnswerConstraint]]:
    found: list[tuple[str, AnswerConstraint]] = []
    if options.json_ is not None:
        found.append(("structured_outputs.json", _json(options.json_, "structured_outputs.json")))
    for value, kind in ((options.regex, "regex"), (options.grammar, "grammar")):
        if value is not None:
            param = f"structured_outputs.{kind}"
            found.append((param, _grammar(kind, value, param)))
    if options.choice is not None:
        param = "structured_outputs.choice"
        found.append((param, _grammar("choice", tuple(options.choice), param)))
    if options.json_object:
        param = "structured_outputs.json_object"
        found.append((param, AnswerConstraint({}, param)))
    if not found:
        raise ApiError(
            400,
            "structured_outputs: give one of json, regex, choice, grammar or json_object",
            code="invalid_request",
            param="structured_outputs",
        )
    return found


def _json(value: Mapping[str, Any] | str, param: str) -> AnswerConstraint:
    """A JSON schema given as an object or as its JSON text (vLLM takes both)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ApiError(
                400,
                f"{param}: not a JSON schema (the text is not JSON: {exc})",
                code="invalid_json_schema",
                param=param,
            ) from None
        if not isinstance(value, dict):
            raise ApiError(
                400,
                f"{param}: a JSON schema is an object, not {type(value).__name__}",
                code="invalid_json_schema",
                param=param,
            )
    return AnswerConstraint(value, param)  # {}: any JSON object, as json_object


def _grammar(
    kind: Literal["regex", "choice", "grammar"], source: str | tuple[str, ...], param: str
) -> AnswerConstraint:
    return AnswerConstraint(grammar=AnswerGrammar(kind, source, param))


class _PromptEndingFields(Protocol):
    continue_final_message: bool | None
    add_generation_prompt: bool | None


def prompt_ending(body: _PromptEndingFields) -> tuple[bool, bool]:
    """(continue the final message, end with the generation prompt) for a chat request (or
    a ``/tokenize`` of messages, which renders them the same way).

    Unset, ``add_generation_prompt`` follows ``continue_final_message`` (on unless the final
    message is continued); set to true beside ``continue_final_message``, it is refused as
    vLLM does: the prompt cannot both leave the last message open and open a new turn."""
    cont = bool(body.continue_final_message)
    add = body.add_generation_prompt
    if cont and add:
        raise ApiError(
            400,
            "continue_final_message and add_generation_prompt cannot both be true: the "
            "prompt either continues the last message or opens a new assistant turn",
            code="invalid_request",
            param="continue_final_message",
        )
    return cont, (not cont) if add is None else add


def echo_text(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    """The text ``echo`` puts before the reply, as vLLM does: the last message's text when
    the reply is in its role (an assistant message; any message when no generation prompt
    opens a new turn), else nothing."""
    last = messages[-1]
    if add_generation_prompt and last.get("role") != "assistant":
        return ""
    content = last.get("content")
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict))


def check_template_kwargs(kwargs: Mapping[str, Any] | None) -> None:
    """Bound ``chat_template_kwargs``: each entry is a template variable, rendered once or
    twice per request, so a megabyte of them would be a megabyte of work for nothing."""
    if not kwargs:
        return
    if len(kwargs) > MAX_TEMPLATE_KWARGS:
        raise ApiError(
            400,
            f"chat_template_kwargs: at most {MAX_TEMPLATE_KWARGS} entries, not {len(kwargs)}",
            code="invalid_value",
            param="chat_template_kwargs",
        )
    size = len(json.dumps(kwargs, ensure_ascii=False).encode("utf-8"))
    if size > MAX_TEMPLATE_KWARGS_BYTES:
        raise ApiError(
            400,
            f"chat_template_kwargs: at most {MAX_TEMPLATE_KWARGS_BYTES} bytes of JSON, not "
            f"{size} (first key {shown(next(iter(kwargs)), 40)})",
            code="invalid_value",
            param="chat_template_kwargs",
        )
