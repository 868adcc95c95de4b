"""Constrained decoding with llguidance: grammars for JSON output and forced tool calls.

Why llguidance: it computes token masks from a tokenizer JSON and a grammar without torch, fast
enough per token on a CPU, and it takes JSON schemas, Lark and special tokens in one grammar.

The mask is applied through the engine's per-request ``logits_processor``, which the engine
calls only after the reasoning part has ended: a thinking model reasons freely and the grammar
governs the answer (the "JSON output silently disables thinking" bug of other servers). The
engine bounds that reasoning (a thinking budget, by default half of ``max_tokens`` for a
constrained request), so the answer the grammar governs always comes.

Grammars:

* ``json_object`` / ``json_schema``: at most 8 leading whitespace characters, then one JSON
  value of the schema, then end of output. Two rules keep a weak model from writing until
  ``max_tokens``:

  - Separators are fixed (``", "`` and ``": "``) and there is no other whitespace, whatever the
    schema's ``x-guidance`` asks, so the model cannot loop on spaces or newlines.
  - An object schema that lists its properties admits only those (``additionalProperties``
    defaults to false, as in OpenAI's strict mode), so the model cannot add keys forever; an
    explicit ``additionalProperties`` (``true`` or a schema) is kept. Objects merged from
    several schemas (``allOf``, ``$ref`` beside ``properties``) stay open: closing each part
    would make their union unsatisfiable.

  What stays bounded only by ``max_tokens``: a free object (``json_object``, or ``{"type":
  "object"}`` with no properties), strings without ``maxLength``, arrays without
  ``maxItems`` and integers without bounds.
* ``tool_choice`` ``required`` / named: one (or, with ``parallel_tool_calls``, several) tool
  calls in the model's native XML form (``<tool_call><function=NAME><parameter=ARG>...``),
  string arguments as text and other arguments as JSON of their schema, then end of output.
  Constrained string arguments cannot contain ``<`` (the parameter close tag starts with it).
* ``regex`` / ``choice`` / ``grammar`` (vLLM's guided decoding): the whole answer matches the
  regular expression, is exactly one of the strings, or is a sentence of the grammar (Lark as
  llguidance reads it, or GBNF, which llguidance converts to Lark), then end of output. No
  leading whitespace is added: the answer is what the client asked for, byte for byte.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ninfer_runtime.engine import Engine
from ninfer_runtime.errors import RequestError

__all__ = [
    "AnswerGrammar",
    "Constraints",
    "GrammarProcessor",
    "closed_objects",
    "json_answer_lark",
]

_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_LEAD = r"/[ \t\r\n]{0,8}/"
# keywords whose values are subschemas (a map of them, one, or a list), the places where an
# object schema can sit; data keywords (const, enum, default, examples) are never walked
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_ONE = ("additionalProperties", "items", "additionalItems", "contains")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
# siblings of "$ref" that make it a merge of two object schemas rather than a plain reference
_OBJECT_KEYWORDS = ("properties", "patternProperties", "additionalProperties", "required", "allOf")


@dataclass(frozen=True)
class AnswerGrammar:
    """A constraint on the whole answer other than JSON: a regular expression, a choice of
    strings, or a grammar text; ``param`` is the request field it came from (its errors
    name it)."""

    kind: Literal["regex", "choice", "grammar"]
    source: str | tuple[str, ...]
    param: str


def _literal(text: str) -> str:
    """A Lark string literal (JSON escapes are valid Lark escapes). JSON leaves DEL (U+007F)
    as it is, which llguidance's lexer refuses inside a literal, so it is escaped too."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _styled(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema with its objects closed and ninfer's JSON layout. The caller's ``x-guidance``
    options are kept except whitespace: flexible whitespace or a pattern of it would let the
    model loop on spaces, so the fixed separators are the only whitespace."""
    out = closed_objects(schema)
    options = out.get("x-guidance")
    if options is None or isinstance(options, Mapping):
        options = {**_JSON_STYLE, "lenient": True, **(options or {})}
        options["whitespace_flexible"] = False
        options.pop("whitespace_pattern", None)
        out["x-guidance"] = options
    return out


def json_answer_lark(schema: Mapping[str, Any] | None) -> str:
    """The Lark grammar of a JSON answer: bounded leading whitespace, then one value of
    ``schema`` (``None``: any JSON object), then the end of output."""
    body = _styled(schema if schema is not None else {"type": "object"})
    return f"start: {_LEAD} answer\nanswer: %json {json.dumps(body)}\n"


def closed_objects(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` in which every object schema that lists its properties (or
    property patterns) and says nothing of others gets ``additionalProperties: false``.

    Required names missing from ``properties`` are listed there with any value, so closing
    never makes a required key unsatisfiable. Object schemas that are parts of a merge (the
    members of an ``allOf``, the schema holding it, a ``$ref`` with object keywords beside it,
    and the definitions those refer to) stay open: llguidance intersects the parts, and each
    closed part would refuse the other parts' keys.
    """
    # a JSON round trip, not deepcopy: one dict reached at two places (aliased in the caller's
    # schema) must become two, or closing one place would close the other
    root = json.loads(json.dumps(schema))
    nodes = dict(_walk(root, "#"))
    merged = _merged_paths(nodes)
    for path, node in nodes.items():
        if path in merged or "additionalProperties" in node or "unevaluatedProperties" in node:
            continue
        props = node.get("properties")
        patterns = node.get("patternProperties")
        if not isinstance(props, dict) and not isinstance(patterns, dict):
            continue
        required = node.get("required")
        required = [n for n in required if isinstance(n, str)] if isinstance(required, list) else []
        unlisted = [n for n in required if not isinstance(props, dict) or n not in props]
        if unlisted and isinstance(patterns, dict):
            continue  # a pattern may be what admits the name; leave the object as written
        if unlisted:
            props.update({name: {} for name in unlisted})  # a dict here: no patterns
        node["additionalProperties"] = False
    return root


def _walk(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON pointer, subschema) for ``node`` and every subschema under it."""
    if not isinstance(node, dict):
        return
    yield path, node
    for key in _SCHEMA_MAPS:
        value = node.get(key)
        if isinstance(value, dict):
            for name, child in value.items():
                yield from _walk(child, f"{path}/{key}/{_pointer_escape(name)}")
    for key in _SCHEMA_ONE:
        yield from _walk(node.get(key), f"{path}/{key}")
    for key in _SCHEMA_LISTS:
        value = node.get(key)
        if isinstance(value, list):
            for i, child in enumerate(value):
                yield from _walk(child, f"{path}/{key}/{i}")


def _pointer_escape(name: str) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")


def _merged_paths(nodes: Mapping[str, dict[str, Any]]) -> set[str]:
    """Pointers of the object schemas that take part in a merge (see ``closed_objects``)."""
    merged: set[str] = set()
    for path, node in nodes.items():
        parts = node.get("allOf")
        if isinstance(parts, list) and len(parts) > 1:
            merged.add(path)
            merged.update(f"{path}/allOf/{i}" for i in range(len(parts)))
        if isinstance(node.get("$ref"), str) and any(k in node for k in _OBJECT_KEYWORDS):
            merged.add(path)
    # a merged part that is a reference merges its target too (and so on along a chain)
    pending = list(merged)
    while pending:
        ref = nodes.get(pending.pop(), {}).get("$ref")
        if isinstance(ref, str) and ref in nodes and ref not in merged:
            merged.add(ref)
            pending.append(ref)
    return merged


class GrammarProcessor:
    """The per-request logits processor: feeds answer tokens to the matcher, masks the rest."""

    def __init__(self, matcher: Any, vocab: int, eos_ids: Sequence[int]):
        self._matcher = matcher
        self._vocab = vocab
        self._eos = np.asarray(list(eos_ids), dtype=np.int64)
        self._consumed = 0

    def __call__(self, logits: np.ndarray, answer_ids: Sequence[int]) -> np.ndarray:
        m = self._matcher
        while self._consumed < len(answer_ids):
            token = int(answer_ids[self._consumed])
            self._consumed += 1
            if not m.consume_token(token):
                break
        if m.is_error():
            # cannot happen with tokens drawn from our own masks; end the output cleanly
            allowed = np.zeros(logits.shape[-1], dtype=bool)
            allowed[self._eos[self._eos < allowed.size]] = True
        else:
            bits = np.frombuffer(m.compute_bitmask(), dtype=np.uint8)
            allowed = np.unpackbits(bits, bitorder="little", count=self._vocab).astype(bool)
            if allowed.size < logits.shape[-1]:
                allowed = np.concatenate(
                    [allowed, np.zeros(logits.shape[-1] - allowed.size, dtype=bool)]
                )
            allowed = allowed[: logits.shape[-1]]
        logits[~allowed] = -np.inf
        return logits


class Constraints:
    """Builds grammars and processors for one engine's tokenizer (thread-safe, lazy)."""

    def __init__(self, engine: Engine):
        self._engine = engine
        self._tokenizer: Any = None
        self._lock = threading.Lock()
        self._valid: dict[str, str] = {}  # grammar -> "" or the error, a small memo

    def _llg_tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                import llguidance

                engine = self._engine
                raw = engine.artifact.resource("tokenizer.json")
                self._tokenizer = llguidance.LLTokenizer(
                    bytes(raw).decode("utf-8"),
                    n_vocab=engine.model.config.vocab,
                    eos_token=list(engine.tokenizer.eos_token_ids) or None,
                )
            return self._tokenizer

    # -- grammars -------------------------------------------------------------------------------

    def json_grammar(self, schema: Mapping[str, Any] | None, param: str) -> str:
        """Grammar for one JSON value of ``schema`` (``None``: any JSON object)."""
        if schema is not None and not isinstance(schema, Mapping):
            raise RequestError(
                "the JSON schema must be an object", param=param, code="invalid_json_schema"
            )
        try:
            lark = json_answer_lark(schema)
        except RecursionError:
            raise _too_deep(param, "invalid_json_schema") from None
        return self._checked(lark, param, "invalid_json_schema")

    def tool_grammar(
        self, tools: Sequence[Mapping[str, Any]], only: str | None, parallel: bool, param: str
    ) -> str:
        """Grammar forcing tool calls (of ``only`` when named) in the native XML form."""
        functions = []
        for tool in tools:
            fn = tool.get("function", tool)
            if only is None or fn.get("name") == only:
                functions.append(fn)
        if not functions:
            raise RequestError(
                f"tool_choice names {only!r}, which is not in tools",
                param=param,
                code="invalid_tool_choice",
            )
        tokenizer = self._engine.tokenizer
        open_id = tokenizer.special.tool_call_open
        close_id = tokenizer.special.tool_call_close
        opener = f"<[{open_id}]>" if open_id is not None else _literal("<tool_call>")
        closer = f"<[{close_id}]>" if close_id is not None else _literal("</tool_call>")
        rules = [
            f"start: {_LEAD} calls",
            'calls: call ("\\n" call)*' if parallel else "calls: call",
            f'call: {opener} "\\n" ({" | ".join(f"fn_{i}" for i in range(len(functions)))}) '
            f'"</function>\\n" {closer}',
        ]
        try:
            for i, fn in enumerate(functions):
                rules.extend(self._function_rules(i, fn))
        except RecursionError:
            raise _too_deep(param, "invalid_tool_schema") from None
        return self._checked("\n".join(rules) + "\n", param, "invalid_tool_schema")

    def _function_rules(self, i: int, fn: Mapping[str, Any]) -> list[str]:
        name = fn.get("name", "")
        params = fn.get("parameters") or {}
        props = params.get("properties") if isinstance(params, Mapping) else None
        props = props if isinstance(props, Mapping) else {}
        required = params.get("required") if isinstance(params, Mapping) else None
        required = [r for r in (required or []) if r in props]
        order = required + [p for p in props if p not in required]
        parts = []
        rules = []
        for j, arg in enumerate(order):
            rule = f"p_{i}_{j}"
            parts.append(rule if arg in required else f"{rule}?")
            head = _literal(f"<parameter={arg}>\n")
            rules.append(f"{rule}: {head} {self._value(props[arg])}")
        header = _literal(f"<function={name}>\n")
        return [f"fn_{i}: {header} {' '.join(parts)}".rstrip(), *rules]

    @staticmethod
    def _value(schema: Any) -> str:
        """A parameter value and its close tag, as the parser of the XML form reads them."""
        close = _literal("\n</parameter>\n")
        schema = schema if isinstance(schema, Mapping) else {}
        if _admits_text(schema):
            if "const" in schema and isinstance(schema["const"], str):
                return f"{_literal(schema['const'])} {close}"
            enum = schema.get("enum")
            if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
                return f"({' | '.join(_literal(v) for v in enum)}) {close}"
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
        body = _styled(schema)
        return f"%json {json.dumps(body)} {close}"

    def answer_grammar(self, spec: AnswerGrammar) -> str:
        """Grammar for an answer that matches ``spec`` whole, then the end of output."""
        import llguidance

        if spec.kind == "regex":
            grammar = llguidance.LLMatcher.grammar_from_regex(str(spec.source))
            return self._validated(grammar, spec.param, "invalid_regex", "the regular expression")
        if spec.kind == "choice":
            lark = "start: " + " | ".join(_literal(choice) for choice in spec.source)
            return self._checked(lark, spec.param, "invalid_choice", "the choices")
        from llguidance.gbnf_to_lark import any_to_lark

        try:  # Lark is taken as it is; GBNF (``root ::= ...``) is converted to Lark
            lark = any_to_lark(str(spec.source))
        except Exception as exc:  # the converter raises its own error types
            raise RequestError(
                f"the grammar is neither Lark nor GBNF: {str(exc).splitlines()[0]}",
                param=spec.param,
                code="invalid_grammar",
            ) from None
        return self._checked(lark, spec.param, "invalid_grammar", "the grammar")

    def _checked(self, lark: str, param: str, code: str, what: str = "the schema") -> str:
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        return self._validated(grammar, param, code, what)

    def _validated(self, grammar: str, param: str, code: str, what: str) -> str:
        import llguidance

        error = self._valid.get(grammar)
        if error is None:
            error = llguidance.LLMatcher.validate_grammar(grammar, self._llg_tokenizer())
            if len(self._valid) > 256:
                self._valid.clear()
            self._valid[grammar] = error
        if error and not error.startswith("WARNING"):
            error = error.splitlines()[0].split(": ", 1)[-1]
            raise RequestError(
                f"{what} cannot be used for constrained decoding: {error}",
                param=param,
                code=code,
            )
        return grammar

    def processor(self, grammar: str) -> GrammarProcessor:
        """A fresh processor (its own matcher state) for one request."""
        import llguidance

        tokenizer = self._llg_tokenizer()
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise RequestError(
                f"constrained decoding cannot start: {matcher.get_error()}",
                param="response_format",
                code="invalid_json_schema",
            )
        return GrammarProcessor(
            matcher, self._engine.model.config.vocab, self._engine.tokenizer.eos_token_ids
        )


def _too_deep(param: str, code: str) -> RequestError:
    return RequestError(
        "the schema is nested too deeply for constrained decoding", param=param, code=code
    )


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
