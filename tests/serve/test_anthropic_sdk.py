"""The official ``anthropic`` SDK against a real server: messages, streaming, tools, counting."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import jsonschema_rs
import pytest

from .conftest import Server, start_server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 16},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "days"],
    },
}


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(artifact, "--max-concurrency", "2", "--max-context", "2048")


@pytest.fixture(scope="module")
def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def test_models_list(client, server):
    assert [m.id for m in client.models.list().data] == [server.model]


def test_message_plain(client, server):
    raw = client.messages.with_raw_response.create(
        model=server.model, max_tokens=64, messages=QUESTION, extra_body={"temperature": 0}
    )
    assert raw.headers["request-id"]
    message = raw.parse()
    assert message.content[0].type == "text"
    assert message.content[0].text == "The capital of France is Paris."
    assert message.stop_reason == "end_turn"
    usage = message.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) > 0 < usage.output_tokens


def test_message_streaming(client, server):
    with client.messages.stream(
        model=server.model, max_tokens=64, messages=QUESTION, extra_body={"temperature": 0}
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "The capital of France is Paris."
    assert final.content[0].text == text and final.stop_reason == "end_turn"


def test_system_blocks_and_stop_sequences(client, server):
    message = client.messages.create(
        model=server.model,
        max_tokens=64,
        extra_body={"temperature": 0},
        system=[{"type": "text", "text": "You are terse."}],
        messages=QUESTION,
        stop_sequences=["France"],
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "France"
    message = client.messages.create(model=server.model, max_tokens=2, messages=QUESTION)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 2


def test_tool_use_streamed_input_reassembles(client, server):
    with client.messages.stream(
        model=server.model,
        max_tokens=200,
        messages=[{"role": "user", "content": "How is the weather?"}],
        tools=[WEATHER],
        tool_choice={"type": "any"},
    ) as stream:
        partial = "".join(
            event.delta.partial_json
            for event in stream
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta"
        )
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    uses = [block for block in final.content if block.type == "tool_use"]
    assert len(uses) >= 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    jsonschema_rs.validate(WEATHER["input_schema"], uses[0].input)
    assert json.loads(partial.split("}{")[0] + ("}" if "}{" in partial else "")) == uses[0].input


def test_tool_result_round_trip(client, server):
    first = client.messages.create(
        model=server.model,
        max_tokens=200,
        messages=[{"role": "user", "content": "How is the weather?"}],
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    )
    use = next(block for block in first.content if block.type == "tool_use")
    follow = client.messages.create(
        model=server.model,
        max_tokens=16,
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "How is the weather?"},
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}
                ],
            },
        ],
    )

    # Anthropic's input_tokens leaves out what was read from the cache (the shared tools and
    # first turn, when an earlier request kept them): the prompt is the two together
    def prompt(usage) -> int:
        return usage.input_tokens + (usage.cache_read_input_tokens or 0)

    assert prompt(follow.usage) > prompt(first.usage)


def test_thinking_and_json_output(client, server):
    schema = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]}},
        "required": ["city"],
        "additionalProperties": False,
    }
    message = client.messages.create(
        model=server.model,
        max_tokens=2048,
        messages=QUESTION,
        thinking={"type": "enabled", "budget_tokens": 1024},
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    text = next(block.text for block in message.content if block.type == "text")
    jsonschema_rs.validate(schema, json.loads(text))


def test_count_tokens_matches_usage(client, server):
    counted = client.messages.count_tokens(model=server.model, messages=QUESTION)
    message = client.messages.create(model=server.model, max_tokens=8, messages=QUESTION)
    usage = message.usage  # the prompt, split into what the prefix cache held and the rest
    parts = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    assert counted.input_tokens == parts


def test_errors_in_anthropic_shape(client, server):
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model=server.model,
            max_tokens=64,
            messages=QUESTION,
            thinking={"type": "enabled", "budget_tokens": 64},
        )
    body = err.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["request_id"]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-nope", max_tokens=8, messages=QUESTION)
