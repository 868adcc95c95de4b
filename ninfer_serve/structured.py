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
  calls in the call form of the chat template's family (``tool_call_grammars``: Qwen's
  ``<function=NAME><parameter=ARG>`` or GLM's ``NAME<arg_key>ARG</arg_key><arg_value>``),
  string arguments as text and other arguments as JSON of their schema, then end of output.
* ``regex`` / ``choice`` / ``grammar`` (vLLM's guided decoding): the whole answer matches the
  regular expression, is exactly one of the strings, or is a sentence of the grammar (Lark as
  llguidance reads it, or GBNF, which llguidance converts to Lark), then end of output. No
  leading whitespace is added: the answer is what the client asked for, byte for byte.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ninfer_runtime.engine import Engine
from ninfer_runtime.errors import RequestError

from .json_lark import closed_objects, json_answer_lark, lark_literal
from .tool_call_grammars import tool_calls_lark

__all__ = [
    "AnswerGrammar",
    "Constraints",
    "GrammarProcessor",
    "closed_objects",
    "json_answer_lark",
]


@dataclass(frozen=True)
class AnswerGrammar:
    """A constraint on the whole answer other than JSON: a regular expression, a choice of
    strings, or a grammar text; ``param`` is the request field it came from (its errors
    name it)."""

    kind: Literal["regex", "choice", "grammar"]
    source: str | tuple[str, ...]
    param: str


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
        """Grammar forcing tool calls (of ``only`` when named) in the call form of the chat
        template's family (``tool_call_grammars``)."""
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
        try:
            lark = tool_calls_lark(
                self._engine.template.chat_format.name, functions, parallel, self._tag
            )
        except RecursionError:
            raise _too_deep(param, "invalid_tool_schema") from None
        return self._checked(lark, param, "invalid_tool_schema")

    def _tag(self, text: str) -> str:
        """A structural tag in a grammar: its token when the vocabulary has it as one."""
        token = self._engine.tokenizer.token_id(text)
        return f"<[{token}]>" if token is not None else lark_literal(text)

    def answer_grammar(self, spec: AnswerGrammar) -> str:
        """Grammar for an answer that matches ``spec`` whole, then the end of output."""
        import llguidance

        if spec.kind == "regex":
            grammar = llguidance.LLMatcher.grammar_from_regex(str(spec.source))
            return self._validated(grammar, spec.param, "invalid_regex", "the regular expression")
        if spec.kind == "choice":
            lark = "start: " + " | ".join(lark_literal(choice) for choice in spec.source)
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
