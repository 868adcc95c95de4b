"""Constrained JSON always ends: unlisted properties are not generated unless the schema allows
them, and whitespace is bounded. The grammar is checked with llguidance's matcher on the bundled
tokenizer (no model), and once end to end against the tiny model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any

import httpx
import llguidance
import pytest
from pydantic import BaseModel, ConfigDict, Field

from ninfer_runtime.errors import RequestError
from ninfer_serve.structured import Constraints, closed_objects, json_answer_lark

from .conftest import BUNDLED, Server, start_server


class Person(BaseModel):
    name: str
    age: int


class Team(BaseModel):
    members: list[Person]


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")
    friend: Person


PERSON = Person.model_json_schema()  # no "additionalProperties": what pydantic sends
PERSON_TEXT = '{"name": "Ada", "age": 36}'


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return llguidance.LLTokenizer((BUNDLED / "tokenizer.json").read_text(encoding="utf-8"))


def accepts(tokenizer: Any, schema: dict[str, Any] | None, text: str) -> bool:
    """Whether the answer grammar of ``schema`` takes ``text`` whole and may end after it."""
    grammar = llguidance.LLMatcher.grammar_from_lark(json_answer_lark(schema))
    assert llguidance.LLMatcher.validate_grammar(grammar, tokenizer) == ""
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    ids = tokenizer.tokenize_str(text)
    if matcher.validate_tokens(ids) < len(ids):
        return False
    assert matcher.consume_tokens(ids)
    return matcher.is_accepting()


def test_a_choice_may_hold_any_character(tokenizer: Any) -> None:
    from ninfer_serve.json_lark import lark_literal as _literal

    choice = 'a\x7fb\x08\\"\x00\x91\U000dff38'
    grammar = llguidance.LLMatcher.grammar_from_lark(f"start: {_literal(choice)}")
    assert llguidance.LLMatcher.validate_grammar(grammar, tokenizer) == ""
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    ids = tokenizer.tokenize_str(choice)
    assert matcher.consume_tokens(ids) and matcher.is_accepting()


def test_only_listed_keys_are_generated(tokenizer: Any) -> None:
    assert accepts(tokenizer, PERSON, PERSON_TEXT)
    Person.model_validate_json(PERSON_TEXT)
    assert not accepts(tokenizer, PERSON, '{"name": "Ada", "age": 36, "city": "London"}')
    assert not accepts(tokenizer, PERSON, '{"city": "London", "name": "Ada", "age": 36}')
    assert closed_objects(PERSON)["additionalProperties"] is False
    assert "additionalProperties" not in PERSON  # the caller's schema is not modified


def test_nested_objects_are_closed_too(tokenizer: Any) -> None:
    schema = Team.model_json_schema()  # Person sits in $defs, reached through $ref
    assert accepts(tokenizer, schema, f'{{"members": [{PERSON_TEXT}]}}')
    assert not accepts(tokenizer, schema, '{"members": [{"name": "Ada", "age": 36, "x": 1}]}')
    assert not accepts(tokenizer, schema, f'{{"members": [], "x": {PERSON_TEXT}}}')


def test_explicitly_allowed_extra_keys_are_kept(tokenizer: Any) -> None:
    loose = Loose.model_json_schema()
    assert loose["additionalProperties"] is True
    assert accepts(tokenizer, loose, f'{{"friend": {PERSON_TEXT}, "city": "London"}}')
    # the Person inside says nothing of other keys, so it is closed
    assert not accepts(tokenizer, loose, '{"friend": {"name": "Ada", "age": 36, "x": 1}}')
    typed = {**PERSON, "additionalProperties": {"type": "integer"}}
    assert accepts(tokenizer, typed, '{"name": "Ada", "age": 36, "height": 170}')
    assert not accepts(tokenizer, typed, '{"name": "Ada", "age": 36, "height": "tall"}')


def test_merged_and_required_only_keys_stay_satisfiable(tokenizer: Any) -> None:
    # closing each part of an allOf would refuse the other part's keys
    part_a = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    part_b = {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}
    merged = {"$defs": {"A": part_a, "B": part_b}, "allOf": [{"$ref": "#/$defs/A"}, part_b]}
    assert accepts(tokenizer, merged, '{"a": 1, "b": 2}')
    # a required name missing from "properties" is still listed; others are not
    required_only = {"type": "object", "properties": {"a": {}}, "required": ["b"]}
    assert accepts(tokenizer, required_only, '{"a": 1, "b": 2}')
    assert not accepts(tokenizer, required_only, '{"a": 1, "b": 2, "c": 3}')


def test_whitespace_is_bounded_whatever_the_schema_asks(tokenizer: Any) -> None:
    flexible = {**PERSON, "x-guidance": {"whitespace_flexible": True}}
    patterned = {**PERSON, "x-guidance": {"whitespace_pattern": "[ \\n]+"}}
    for schema in (PERSON, flexible, patterned):
        assert accepts(tokenizer, schema, " " * 8 + PERSON_TEXT)
        assert not accepts(tokenizer, schema, " " * 9 + PERSON_TEXT)
        assert not accepts(tokenizer, schema, "\n" * 9 + PERSON_TEXT)
        assert not accepts(tokenizer, schema, '{"name": "Ada", ' + " " * 40 + '"age": 36}')
        assert not accepts(tokenizer, schema, '{\n  "name": "Ada",\n  "age": 36\n}')
        assert not accepts(tokenizer, schema, PERSON_TEXT + " ")
    # the caller's other options are kept: fixed separators of its choice
    compact = {**PERSON, "x-guidance": {"item_separator": ",", "key_separator": ":"}}
    assert accepts(tokenizer, compact, '{"name":"Ada","age":36}')
    assert not accepts(tokenizer, compact, PERSON_TEXT)
    # json_object: any keys, the same whitespace rule
    assert accepts(tokenizer, None, '{"anything": [1, {"goes": null}], "here": true}')
    assert not accepts(tokenizer, None, '{"anything":  1}')
    assert not accepts(tokenizer, None, '{\n"anything": 1}')


def test_a_schema_too_deep_to_walk_is_one_clear_error() -> None:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(5000):
        schema = {"type": "object", "properties": {"a": schema}}
    # the grammar is built before any tokenizer is needed, so no engine is loaded
    with pytest.raises(RequestError) as error:
        Constraints(engine=None).json_grammar(schema, "response_format.json_schema.schema")
    assert str(error.value) == "the schema is nested too deeply for constrained decoding"
    assert error.value.param == "response_format.json_schema.schema"
    assert error.value.code == "invalid_json_schema"


# -- end to end -------------------------------------------------------------------------------


class BoundedPerson(BaseModel):
    """Person with bounded fields. The tiny model never writes a closing quote by itself, so a
    free ``name: str`` runs to ``max_tokens`` (a string without ``maxLength`` is bounded only by
    it, see docs/serve.md); with both fields bounded the only unbounded choice left is whether
    the object takes more keys, which is what this test is about."""

    name: Annotated[str, Field(max_length=12)]
    age: Annotated[int, Field(ge=0, le=150)]


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(artifact, "--max-concurrency", "2", "--max-context", "2048")


def test_a_pydantic_answer_ends_and_validates(server: Server) -> None:
    # with extra keys allowed, the tiny model opens a new key after "age" and never closes it
    schema = BoundedPerson.model_json_schema()
    assert "additionalProperties" not in schema
    for seed in range(4):
        body = {
            "model": server.model,
            "messages": [{"role": "user", "content": "Describe a person as JSON."}],
            "seed": seed,
            "max_tokens": 64,
            "enable_thinking": False,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "Person", "schema": schema},
            },
        }
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
        choice = reply["choices"][0]
        assert choice["finish_reason"] == "stop", json.dumps(reply)
        person = BoundedPerson.model_validate_json(choice["message"]["content"])
        assert set(json.loads(choice["message"]["content"])) == {"name", "age"}
        assert 0 <= person.age <= 150
