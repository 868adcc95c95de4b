"""The forced tool-call grammar of a GLM template: whatever path a model takes through it, GLM's
parser reads back one call of the forced function with arguments valid against its schema.
Random walks through llguidance's masks on the bundled tokenizer (no model), with GLM's argument
tags as text and as tokens of the vocabulary."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace
from typing import Any

import jsonschema_rs
import llguidance
import numpy as np
import pytest
from tokenizers import Tokenizer as Backend

from ninfer_runtime.frontend.chat_format import GLM, QWEN
from ninfer_runtime.frontend.glm_tool_calls import GlmOutputParser
from ninfer_runtime.frontend.parsers import OutputAccumulator
from ninfer_runtime.frontend.tokenizer import (
    ARG_KEY_CLOSE,
    ARG_KEY_OPEN,
    ARG_VALUE_CLOSE,
    ARG_VALUE_OPEN,
    Tokenizer,
)
from ninfer_serve.structured import Constraints

from .conftest import BUNDLED

BOOK = {
    "type": "function",
    "function": {
        "name": "book_table",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 6},
                "guests": {"type": "integer", "minimum": 1, "maximum": 12},
                "seating": {"type": "string", "enum": ["inside", "terrace"]},
                "notes": {"type": "string", "maxLength": 4},
                "vip": {"type": "boolean"},
            },
            "required": ["name", "guests", "seating"],
        },
    },
}
OTHER = {"type": "function", "function": {"name": "cancel", "parameters": {"type": "object"}}}


def constraints(family: Any, tags_are_tokens: bool) -> tuple[Constraints, Tokenizer]:
    """``Constraints`` of an engine stand-in with the bundled tokenizer and ``family``'s
    template; with ``tags_are_tokens``, GLM's argument tags are added tokens, as in GLM's
    vocabulary."""
    backend = Backend.from_file(str(BUNDLED / "tokenizer.json"))
    if tags_are_tokens:
        backend.add_special_tokens([ARG_KEY_OPEN, ARG_KEY_CLOSE, ARG_VALUE_OPEN, ARG_VALUE_CLOSE])
    text = backend.to_str()
    tokenizer = Tokenizer(
        backend, generation_config={"eos_token_id": [backend.token_to_id("<|im_end|>")]}
    )
    engine = SimpleNamespace(
        tokenizer=tokenizer,
        template=SimpleNamespace(chat_format=family),
        model=SimpleNamespace(config=SimpleNamespace(vocab=backend.get_vocab_size())),
        artifact=SimpleNamespace(resource=lambda role: text.encode()),
    )
    return Constraints(engine), tokenizer  # type: ignore[arg-type]


def walk(constraints: Constraints, grammar: str, seed: int) -> list[int]:
    """Tokens drawn uniformly from what the grammar's processor allows at each step, until
    the end of output is drawn (the walk is bounded: every string has a maxLength)."""
    processor = constraints.processor(grammar)
    vocab = constraints._engine.model.config.vocab
    (eos,) = constraints._engine.tokenizer.eos_token_ids
    rng = random.Random(seed)
    ids: list[int] = []
    for _ in range(400):
        allowed = np.flatnonzero(np.isfinite(processor(np.zeros(vocab, np.float32), ids)))
        token = int(rng.choice(allowed))
        if token == eos:
            return ids
        ids.append(token)
    raise AssertionError("the grammar did not end within 400 tokens")


def read_calls(tokenizer: Tokenizer, ids: list[int]) -> list[tuple[str, dict[str, Any]]]:
    text = b"".join(tokenizer.token_bytes(i) for i in ids).decode("utf-8")
    assert "<function=" not in text  # GLM's form, not Qwen's (which the parser reads too)
    parser = GlmOutputParser(tools=[BOOK, OTHER], call_id=lambda i: f"call_{i}")
    out = OutputAccumulator()
    out.add(parser.feed(text.replace("<|im_end|>", "")))
    out.add(parser.finish())
    result = out.result()
    assert not result.content.strip(), text  # nothing left as text: the calls were read
    return [(c.name, json.loads(c.arguments)) for c in result.tool_calls]


@pytest.mark.parametrize("tags_are_tokens", [False, True])
def test_forced_calls_read_back_valid(tags_are_tokens: bool) -> None:
    glm, tokenizer = constraints(GLM, tags_are_tokens)
    grammar = glm.tool_grammar([BOOK, OTHER], "book_table", False, "tool_choice")
    for seed in range(12):
        calls = read_calls(tokenizer, walk(glm, grammar, seed))
        assert [name for name, _ in calls] == ["book_table"], calls
        assert {"name", "guests", "seating"} <= calls[0][1].keys()
        jsonschema_rs.validate(BOOK["function"]["parameters"], calls[0][1])


def test_parallel_calls_of_any_tool() -> None:
    glm, tokenizer = constraints(GLM, True)
    grammar = glm.tool_grammar([BOOK, OTHER], None, True, "tool_choice")
    names = set()
    for seed in range(12):
        calls = read_calls(tokenizer, walk(glm, grammar, seed))
        assert calls
        for name, arguments in calls:
            schema = (BOOK if name == "book_table" else OTHER)["function"]["parameters"]
            jsonschema_rs.validate(schema, arguments)
            names.add(name)
    assert names == {"book_table", "cancel"}


def test_a_string_value_holds_any_text_but_its_end_tag() -> None:
    glm, _ = constraints(GLM, False)
    note = {"name": "note", "parameters": {"properties": {"text": {"type": "string"}}}}
    grammar = glm.tool_grammar([note], None, False, "tool_choice")
    tokenizer = glm._llg_tokenizer()

    def accepts(value: str) -> bool:
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        text = f"<tool_call>note<arg_key>text</arg_key><arg_value>{value}</arg_value></tool_call>"
        ids = tokenizer.tokenize_str(text)
        return matcher.validate_tokens(ids) == len(ids) and matcher.consume_tokens(ids)

    assert accepts("a < b\nand <c>")
    assert not accepts("a</arg_value>b")
    assert not accepts("a</tool_call>b")


def test_the_qwen_family_keeps_the_xml_form() -> None:
    qwen, _ = constraints(QWEN, False)
    grammar = qwen.tool_grammar([BOOK], None, False, "tool_choice")
    lark = json.dumps(grammar)
    assert "<function=book_table>" in lark and "arg_key" not in lark
