"""The official ``openai`` SDK against a real server: chat, streaming, tools, JSON, Responses."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema_rs
import openai
import pytest

from .conftest import Server, start_server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "days"],
        },
    },
}
NOOP = {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 40},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "population_millions", "capital"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(artifact, "--max-concurrency", "2", "--max-context", "2048")


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_models(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [server.model]
    model = client.models.retrieve(server.model)
    assert model.model_extra["max_model_len"] == 2048
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_chat_plain(client, server):
    raw = client.chat.completions.with_raw_response.create(
        model=server.model, messages=QUESTION, temperature=0
    )
    assert raw.headers["x-request-id"]
    reply = raw.parse()
    choice = reply.choices[0]
    assert choice.message.content == "The capital of France is Paris."
    assert choice.finish_reason == "stop"
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_streaming_matches_plain(client, server):
    stream = client.chat.completions.create(
        model=server.model,
        messages=QUESTION,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(text) == "The capital of France is Paris."
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens > 0


def test_stop_and_max_tokens(client, server):
    reply = client.chat.completions.create(
        model=server.model, messages=QUESTION, temperature=0, stop=["France"]
    )
    assert reply.choices[0].message.content == "The capital of"
    assert reply.choices[0].model_extra["stop_reason"] == "France"
    reply = client.chat.completions.create(
        model=server.model, messages=QUESTION, temperature=0, max_completion_tokens=3
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 3


def test_streamed_tool_call_arguments_reassemble(client, server):
    stream = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "How is the weather?"}],
        tools=[WEATHER, NOOP],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=True,
        seed=3,
        extra_body={"enable_thinking": False},
    )
    calls: dict[int, dict] = {}
    deltas = 0
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"name": None, "arguments": ""})
                if call.function.name:
                    entry["name"] = call.function.name
                    entry["id"] = call.id
                entry["arguments"] += call.function.arguments or ""
                deltas += 1
    assert finish == "tool_calls"
    assert list(calls) == [0]
    call = calls[0]
    assert call["name"] == "get_weather" and call["id"]
    arguments = json.loads(call["arguments"])
    jsonschema_rs.validate(WEATHER["function"]["parameters"], arguments)
    assert deltas > 2  # the arguments arrived in pieces, not in one final chunk


def test_required_tool_choice_non_streaming(client, server):
    for seed in range(3):
        reply = client.chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "How is the weather?"}],
            tools=[WEATHER, NOOP],
            tool_choice="required",
            parallel_tool_calls=False,
            seed=seed,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        schema = WEATHER["function"]["parameters"] if call.function.name == "get_weather" else {}
        jsonschema_rs.validate(schema, json.loads(call.function.arguments))


def test_json_schema_output_validates(client, server):
    for seed in range(3):
        reply = client.chat.completions.create(
            model=server.model,
            messages=QUESTION,
            seed=seed,
            max_tokens=200,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA},
            },
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "stop"
        jsonschema_rs.validate(ANSWER_SCHEMA, json.loads(choice.message.content))


def test_json_schema_coexists_with_thinking(client, server):
    reply = client.chat.completions.create(
        model=server.model,
        messages=QUESTION,
        seed=1,
        max_tokens=300,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA},
        },
        extra_body={"chat_template_kwargs": {"enable_thinking": True}},
    )
    jsonschema_rs.validate(ANSWER_SCHEMA, json.loads(reply.choices[0].message.content))
    # the template opened <think>: the tokens up to </think> were reasoning, unconstrained
    assert reply.usage.completion_tokens_details.reasoning_tokens >= 1


def test_json_object_starts_an_object(client, server):
    reply = client.chat.completions.create(
        model=server.model,
        messages=QUESTION,
        seed=0,
        max_tokens=12,
        response_format={"type": "json_object"},
        extra_body={"enable_thinking": False},
    )
    assert reply.choices[0].message.content.startswith("{")


def test_invalid_schema_is_a_400(client, server):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=server.model,
            messages=QUESTION,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            },
        )
    assert err.value.body["code"] == "invalid_json_schema"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("best_of", 2),
        ("logit_bias", {"5": 10}),
        ("use_beam_search", True),
        ("audio", {"voice": "x"}),
    ],
)
def test_result_changing_fields_are_refused(client, server, field, value):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=server.model, messages=QUESTION, extra_body={field: value}
        )
    assert err.value.body["param"] == field


def test_context_length_exceeded(client, server):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": "word " * 3000}]
        )
    assert err.value.body["code"] == "context_length_exceeded"
    assert "2048" in err.value.body["message"]


def test_responses_create_chain_retrieve_delete(client, server):
    first = client.responses.create(
        model=server.model, input="What is the capital of France?", temperature=0
    )
    assert first.status == "completed"
    assert first.output_text == "The capital of France is Paris."
    second = client.responses.create(
        model=server.model,
        input="Thank you!",
        previous_response_id=first.id,
        temperature=0,
        max_output_tokens=8,
    )
    # the prompt held the first exchange (the tiny model's answer itself is not the point)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert client.responses.retrieve(first.id).output_text == first.output_text
    count = client.responses.input_tokens.count(
        model=server.model, input="What is the capital of France?"
    )
    assert count.input_tokens == first.usage.input_tokens
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=server.model, input="x", previous_response_id=first.id)


def test_responses_streaming_events(client, server):
    events = list(
        client.responses.create(model=server.model, input="Hello!", temperature=0, stream=True)
    )
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == "Hello! How can I help you today?"


def test_responses_function_call_and_json(client, server):
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": WEATHER["function"]["parameters"],
    }
    with client.responses.stream(
        model=server.model,
        input="How is the weather?",
        tools=[tool],
        tool_choice="required",
        reasoning={"effort": "none"},
    ) as s:
        for _ in s:
            pass
        final = s.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    assert len(calls) >= 1 and calls[0].name == "get_weather"
    jsonschema_rs.validate(tool["parameters"], json.loads(calls[0].arguments))
    reply = client.responses.create(
        model=server.model,
        input="What is the capital of France?",
        max_output_tokens=200,
        text={"format": {"type": "json_schema", "name": "a", "schema": ANSWER_SCHEMA}},
    )
    jsonschema_rs.validate(ANSWER_SCHEMA, json.loads(reply.output_text))


def test_responses_unknown_parameter(client, server):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=server.model, input="x", extra_body={"bogus": 1})
    assert err.value.body["param"] == "bogus"
