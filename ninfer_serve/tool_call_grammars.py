"""Lark grammars that force tool calls, written in the call form of the chat template's family.

Each grammar admits bounded leading whitespace, then one call (or, with ``parallel``, several)
to one of ``functions``, then the end of output. Every required argument is written, the
optional ones may be, each at most once and in the schema's order (required first); a value is
text exactly where the family's parser keeps it as text, and JSON of its schema elsewhere, so
the parser reads back arguments that follow the schema as far as a grammar can say it.

* Qwen (``ChatFormat`` "qwen"): ``<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n
  </parameter>\\n...</function>\\n</tool_call>``. Text values cannot contain ``<`` (the close tag
  starts with it) nor end in a newline (the layout newline before the close tag).
* GLM (``ChatFormat`` "glm"): ``<tool_call>NAME<arg_key>ARG</arg_key><arg_value>VALUE
  </arg_value>...</tool_call>``, with at most one newline where GLM's templates put one (after
  the name and each tag; GLM-4.5 writes them, GLM-5 not), which the parser skips. Text values
  are any text without ``</arg_value>`` or ``</tool_call>`` (where the parser ends a value).

Text values follow ``const``, string ``enum`` members, ``minLength`` and ``maxLength``;
``pattern`` and ``format`` are not enforced. A tag that is one token of the vocabulary is
written as that token: llguidance treats every added token as special, so the tag's text
would not match it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ninfer_runtime.frontend.glm_tool_calls import glm_value_is_text
from ninfer_runtime.frontend.tokenizer import (
    ARG_KEY_CLOSE,
    ARG_KEY_OPEN,
    ARG_VALUE_CLOSE,
    ARG_VALUE_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
)

from .json_lark import LEAD_WHITESPACE, lark_literal, styled_schema

__all__ = ["glm_calls_lark", "qwen_calls_lark", "tool_calls_lark"]

_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~/")
#: a tag's grammar: its token (``<[id]>``) when the vocabulary has it as one, else its text
Tag = Callable[[str], str]


def tool_calls_lark(
    family: str, functions: Sequence[Mapping[str, Any]], parallel: bool, tag: Tag
) -> str:
    """The grammar forcing calls of ``functions`` (OpenAI function objects: name, parameters)
    in the form of ``family`` ("glm", else Qwen's)."""
    build = glm_calls_lark if family == "glm" else qwen_calls_lark
    return build(functions, parallel, tag)


# -- Qwen ---------------------------------------------------------------------------------------


def qwen_calls_lark(functions: Sequence[Mapping[str, Any]], parallel: bool, tag: Tag) -> str:
    """Qwen's XML form (see the module docstring)."""
    rules = [
        f"start: {LEAD_WHITESPACE} calls",
        'calls: call ("\\n" call)*' if parallel else "calls: call",
        f'call: {tag(TOOL_CALL_OPEN)} "\\n" ({_alternatives(len(functions))}) '
        f'"</function>\\n" {tag(TOOL_CALL_CLOSE)}',
    ]
    for i, fn in enumerate(functions):
        rules.extend(_qwen_function_rules(i, fn))
    return "\n".join(rules) + "\n"


def _qwen_function_rules(i: int, fn: Mapping[str, Any]) -> list[str]:
    name = fn.get("name", "")
    props, required = _arguments(fn)
    required = [r for r in required if r in props]
    order = required + [p for p in props if p not in required]
    parts = []
    rules = []
    for j, arg in enumerate(order):
        rule = f"p_{i}_{j}"
        parts.append(rule if arg in required else f"{rule}?")
        head = lark_literal(f"<parameter={arg}>\n")
        rules.append(f"{rule}: {head} {_qwen_value(props[arg])}")
    header = lark_literal(f"<function={name}>\n")
    return [f"fn_{i}: {header} {' '.join(parts)}".rstrip(), *rules]


def _qwen_value(schema: Any) -> str:
    """A parameter value and its close tag, as the parser of the XML form reads them."""
    close = lark_literal("\n</parameter>\n")
    schema = schema if isinstance(schema, Mapping) else {}
    if _admits_text(schema):
        if "const" in schema and isinstance(schema["const"], str):
            return f"{lark_literal(schema['const'])} {close}"
        enum = schema.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
            return f"({' | '.join(lark_literal(v) for v in enum)}) {close}"
        # text without "<" that does not end in a newline (the layout newline before the
        # close tag is the grammar's), bounded by minLength / maxLength
        low = max(int(schema.get("minLength", 0) or 0) - 1, 0)
        high = schema.get("maxLength")
        if isinstance(high, int) and high < 1:
            return close
        count = f"{{{low},{high - 1}}}" if isinstance(high, int) else f"{{{low},}}"
        text = f"[^<]{count}[^<\\n]"
        if not schema.get("minLength"):
            text = f"({text})?"
        return f"/{text}\\n<\\/parameter>\\n/"
    return f"%json {json.dumps(styled_schema(schema))} {close}"


def _admits_text(schema: Mapping[str, Any]) -> bool:
    """Whether the XML-form parser keeps this parameter's value as raw text (the schema admits
    a string, or says nothing about the type), mirroring ``frontend.parsers``."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind == "string"
    if isinstance(kind, list):
        return not kind or "string" in kind
    options = [o for key in ("anyOf", "oneOf") for o in schema.get(key) or ()]
    if options:
        return any(isinstance(o, Mapping) and _admits_text(o) for o in options)
    if "properties" in schema or "items" in schema:
        return False
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return any(isinstance(v, str) for v in enum)
    return True


# -- GLM ----------------------------------------------------------------------------------------

_NEWLINE = '"\\n"?'
#: the end tags at which GLM's parser ends a value: text values never contain them
_VALUE_ENDS = (ARG_VALUE_CLOSE, TOOL_CALL_CLOSE)


def glm_calls_lark(functions: Sequence[Mapping[str, Any]], parallel: bool, tag: Tag) -> str:
    """GLM's ``<arg_key>``/``<arg_value>`` form (see the module docstring)."""
    rules = [
        f"start: {LEAD_WHITESPACE} calls",
        f"calls: call ({_NEWLINE} call)*" if parallel else "calls: call",
        f"call: {tag(TOOL_CALL_OPEN)} ({_alternatives(len(functions))}) {tag(TOOL_CALL_CLOSE)}",
    ]
    for i, fn in enumerate(functions):
        rules.extend(_glm_function_rules(i, fn, tag))
    return "\n".join(rules) + "\n"


def _glm_function_rules(i: int, fn: Mapping[str, Any], tag: Tag) -> list[str]:
    props, required = _arguments(fn)
    # a required name the schema does not describe takes any JSON value
    schemas = {**props, **{name: {} for name in required if name not in props}}
    order = required + [p for p in props if p not in required]
    parts = []
    rules = []
    for j, arg in enumerate(order):
        rule = f"a_{i}_{j}"
        parts.append(rule if arg in required else f"{rule}?")
        key = f"{tag(ARG_KEY_OPEN)} {lark_literal(arg)} {tag(ARG_KEY_CLOSE)} {_NEWLINE}"
        value, terminal = _glm_value(schemas[arg], tag, f"TEXT_{i}_{j}")
        rules.append(f"{rule}: {key} {tag(ARG_VALUE_OPEN)} {value} {_NEWLINE}")
        if terminal:
            rules.append(terminal)
    name = lark_literal(str(fn.get("name", "")))
    return [f"fn_{i}: {name} {_NEWLINE} {' '.join(parts)}".rstrip(), *rules]


def _glm_value(schema: Any, tag: Tag, terminal: str) -> tuple[str, str | None]:
    """A value and its close tag, and the Lark terminal a free text value needs (None for
    others): text where ``glm_value_is_text`` says the parser keeps text, else JSON."""
    close = tag(ARG_VALUE_CLOSE)
    schema = schema if isinstance(schema, Mapping) else {}
    if not glm_value_is_text(schema):
        return f"%json {json.dumps(styled_schema(schema))} {close}", None
    choices = _text_choices(schema)
    if choices is not None:
        return f"{choices} {close}", None
    low = max(int(schema.get("minLength", 0) or 0), 0)
    high = schema.get("maxLength")
    text = f"(.|\\n){{{low},{high if isinstance(high, int) else ''}}}"
    ends = "|".join(_regex_text(end) for end in _VALUE_ENDS)
    if close != lark_literal(ARG_VALUE_CLOSE):  # the close tag is a token: text, then it
        return f"{terminal} {close}", f"{terminal}: /{text}/ & ~/(.|\\n)*({ends})(.|\\n)*/"
    # the close tag is text: one lexeme runs through it, so the value ends at its first
    # close tag (a lexeme ending before it would let the lexer read on past it)
    return terminal, (
        f"{terminal}: /{text}{_regex_text(ARG_VALUE_CLOSE)}/ & ~/(.|\\n)*({ends})(.|\\n)+/"
    )


def _text_choices(schema: Mapping[str, Any]) -> str | None:
    """The alternatives a string ``const`` or the string members of an ``enum`` allow (the
    others cannot be text; None: free text)."""
    if isinstance(schema.get("const"), str):
        return lark_literal(schema["const"])
    enum = schema.get("enum")
    strings = [v for v in enum if isinstance(v, str)] if isinstance(enum, list) else []
    if strings:
        return f"({' | '.join(lark_literal(v) for v in strings)})"
    return None


# -- shared -------------------------------------------------------------------------------------


def _arguments(fn: Mapping[str, Any]) -> tuple[Mapping[str, Any], list[str]]:
    """The function's parameter schemas by name and its required names."""
    params = fn.get("parameters") or {}
    props = params.get("properties") if isinstance(params, Mapping) else None
    props = props if isinstance(props, Mapping) else {}
    required = params.get("required") if isinstance(params, Mapping) else None
    required = [r for r in (required or []) if isinstance(r, str)]
    return props, list(dict.fromkeys(required))


def _alternatives(count: int) -> str:
    return " | ".join(f"fn_{i}" for i in range(count))


def _regex_text(text: str) -> str:
    """``text`` as a Lark regex that matches it literally. Only metacharacters and ``/`` (which
    ends a Lark regex) are escaped: an escaped ``<`` or ``>`` is a word boundary there."""
    return "".join(f"\\{c}" if c in _REGEX_META else c for c in text)
