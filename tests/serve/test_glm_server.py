"""A tiny GLM5Next artifact served (``tests/tiny_glm5_next.py``, converted without a chat
template, so the engine takes ninfer's built-in GLM-5 one): a tool call through the OpenAI SDK
and the conversation that answers it, a forced call written in GLM's own form (string, integer
and enum arguments), and reasoning effort on the three APIs. The model is random, so calls are
forced with ``tool_choice``; the parser's reading of GLM's form is tested in
``tests/runtime/frontend/test_glm_tool_calls.py``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema_rs
import openai
import pytest

from .conftest import Server, start_server

tiny = pytest.importorskip("tests.tiny_glm5_next")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}
ASK = [{"role": "user", "content": "How is the weather?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("glm_serve")
    checkpoint = tiny.build_tiny_glm5_next(root / "checkpoint", mtp=False)
    (checkpoint / "chat_template.jinja").unlink()  # the builder writes a ChatML one
    tiny.convert("glm5_next_bf16", checkpoint, root / "tiny.ninfer")
    yield from start_server(root / "tiny.ninfer", "--max-context", "1024")


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_a_tool_call_and_its_answer(client: openai.OpenAI, server: Server) -> None:
    reply = client.chat.completions.create(
        model=server.model,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        seed=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema_rs.validate(WEATHER["function"]["parameters"], json.loads(call.function.arguments))
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    answer = client.chat.completions.create(
        model=server.model, messages=history, tools=[WEATHER], max_tokens=3, temperature=0
    )
    assert answer.choices[0].finish_reason in ("length", "stop")
    assert answer.usage.prompt_tokens > reply.usage.prompt_tokens


BOOK = {
    "type": "function",
    "function": {
        "name": "book_table",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 6},
                "guests": {"type": "integer", "minimum": 1, "maximum": 12},
                "seating": {"type": "string", "enum": ["inside", "terrace"]},
            },
            "required": ["name", "guests", "seating"],
        },
    },
}


@pytest.mark.parametrize("seed", [0, 1])
def test_a_forced_call_is_written_in_glm_form(server: Server, seed: int) -> None:
    """The forcing grammar follows the template's family: the raw output is GLM's form (not
    Qwen's XML, which the parser would read too), and the parser reads it back."""
    body = {
        "model": server.model,
        "messages": ASK,
        "tools": [BOOK],  # one tool: the tiny tokenizer spells the tags out, a token a letter
        "tool_choice": {"type": "function", "function": {"name": "book_table"}},
        "seed": seed,
        "logprobs": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    raw = b"".join(bytes(t["bytes"]) for t in choice["logprobs"]["content"]).decode()
    assert choice["finish_reason"] == "tool_calls", raw
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "book_table"
    jsonschema_rs.validate(
        BOOK["function"]["parameters"], json.loads(call["function"]["arguments"])
    )
    assert raw.lstrip().startswith("<tool_call>book_table") and "<arg_key>" in raw, raw


def test_anthropic_any_forces_a_glm_call(server: Server) -> None:
    tool = {"name": "book_table", "input_schema": BOOK["function"]["parameters"]}
    body = {
        "model": server.model,
        "max_tokens": 200,
        "messages": ASK,
        "tools": [tool],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "thinking": {"type": "disabled"},
    }
    reply = httpx.post(f"{server.url}/v1/messages", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    message = reply.json()
    assert message["stop_reason"] == "tool_use", message
    (use,) = [block for block in message["content"] if block["type"] == "tool_use"]
    assert use["name"] == "book_table"
    jsonschema_rs.validate(tool["input_schema"], use["input"])


def test_reasoning_effort_levels(client: openai.OpenAI, server: Server) -> None:
    low = client.chat.completions.create(
        model=server.model, messages=ASK, reasoning_effort="low", max_tokens=4, temperature=0
    )
    assert low.usage.completion_tokens_details.reasoning_tokens > 0  # the prompt opened <think>
    off = client.chat.completions.create(
        model=server.model, messages=ASK, reasoning_effort="none", max_tokens=4, temperature=0
    )
    assert off.usage.completion_tokens_details.reasoning_tokens == 0
    default = client.chat.completions.create(
        model=server.model, messages=ASK, max_tokens=1, temperature=0
    )  # thinking on at the template's default level, max: the same prompt but for </think>
    assert off.usage.prompt_tokens > default.usage.prompt_tokens
    # a ChatML template would take medium as a budget: this one is GLM's, with its own levels
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=server.model, messages=ASK, reasoning_effort="medium", max_tokens=4
        )
    assert refused.value.code == "unsupported_parameter"
    assert refused.value.param == "reasoning_effort"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/responses", {"input": "hi", "reasoning": {"effort": "medium"}}, "reasoning.effort"),
        (
            "/v1/messages",
            {"messages": ASK, "max_tokens": 4, "output_config": {"effort": "medium"}},
            "output_config.effort",
        ),
    ],
)
def test_other_apis_refuse_a_level_glm_has_not(server: Server, path: str, body, param) -> None:
    reply = httpx.post(f"{server.url}{path}", json={"model": server.model, **body}, timeout=60)
    assert reply.status_code == 400, reply.text
    assert param in reply.json()["error"]["message"]


def test_other_apis_take_glm_levels(server: Server) -> None:
    for path, body in [
        ("/v1/responses", {"input": "hi", "reasoning": {"effort": "high"}, "max_output_tokens": 3}),
        ("/v1/messages", {"messages": ASK, "max_tokens": 3, "output_config": {"effort": "max"}}),
    ]:
        reply = httpx.post(f"{server.url}{path}", json={"model": server.model, **body}, timeout=60)
        assert reply.status_code == 200, reply.text
