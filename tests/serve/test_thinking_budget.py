"""The thinking budget: reasoning stops at it with ``</think>`` and the answer follows; a
structured answer or a forced tool call is never starved by reasoning."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ninfer_serve.anthropic.messages import to_job as anthropic_job
from ninfer_serve.anthropic.models import MessagesRequest
from ninfer_serve.errors import ApiError
from ninfer_serve.openai.chat import EFFORT_BUDGETS
from ninfer_serve.openai.chat import to_job as chat_job
from ninfer_serve.openai.models import ChatCompletionRequest

from .conftest import Server, generate_all, start_server

ASK = [{"role": "user", "content": "Hello!"}]
#: flat sampling, so the tiny model (trained to close reasoning at once) keeps thinking
HOT = {"temperature": 2, "top_k": -1, "top_p": 1, "enable_thinking": True}
CITY = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": CITY}}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(artifact, "--max-concurrency", "2", "--max-context", "2048")


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json={"model": server.model, **body}, timeout=60)


def chat(server: Server, **body: Any) -> dict[str, Any]:
    reply = post(server, "/v1/chat/completions", {"messages": ASK, **HOT, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


def reasoning_tokens(reply: dict[str, Any]) -> int:
    return reply["usage"]["completion_tokens_details"]["reasoning_tokens"]


@pytest.fixture(scope="module")
def long_thinker(server: Server) -> int:
    """A seed with which the model, left alone, thinks through all of 40 tokens."""
    for seed in range(32):
        reply = chat(server, seed=seed, max_tokens=40, ignore_eos=True)
        if reasoning_tokens(reply) == 40:
            return seed
    raise AssertionError("no seed in 0..31 keeps the tiny model thinking for 40 tokens")


def test_reasoning_stops_at_the_budget(server: Server, long_thinker: int) -> None:
    body = {"seed": long_thinker, "max_tokens": 40, "ignore_eos": True, "max_thinking_tokens": 8}
    reply = chat(server, **body)
    assert reasoning_tokens(reply) == 8  # seven of thought, then the forced </think>
    message = reply["choices"][0]["message"]
    assert message["content"] and "</think>" not in message["content"]
    assert message["reasoning_content"] is None or "</think>" not in message["reasoning_content"]
    streamed = {"reasoning_content": "", "content": ""}
    with httpx.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        json={"model": server.model, "messages": ASK, **HOT, **body, "stream": True},
        timeout=60,
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    for key in streamed:
                        streamed[key] += choice["delta"].get(key) or ""
    assert streamed["content"] == message["content"]
    assert streamed["reasoning_content"] == (message["reasoning_content"] or "")


def test_json_follows_an_explicit_budget(server: Server, long_thinker: int) -> None:
    for seed in (long_thinker, 0, 1, 2):
        reply = chat(
            server, seed=seed, max_tokens=60, response_format=JSON_FORMAT, max_thinking_tokens=6
        )
        assert reasoning_tokens(reply) <= 6
        assert json.loads(reply["choices"][0]["message"]["content"])["city"] in ("Paris", "Rome")


def test_structured_output_gets_a_default_budget(server: Server, long_thinker: int) -> None:
    reply = chat(
        server, seed=long_thinker, max_tokens=60, ignore_eos=True, response_format=JSON_FORMAT
    )
    assert reasoning_tokens(reply) == 30  # half of max_tokens
    assert json.loads(reply["choices"][0]["message"]["content"])["city"] in ("Paris", "Rome")
    larger = {"max_thinking_tokens": 50, "response_format": JSON_FORMAT, "ignore_eos": True}
    reply = chat(server, seed=long_thinker, max_tokens=60, **larger)
    assert reasoning_tokens(reply) == 30, "a budget over half of max_tokens is cut to it"
    assert json.loads(reply["choices"][0]["message"]["content"])["city"] in ("Paris", "Rome")


def test_a_stop_inside_reasoning_still_gets_the_answer(server: Server) -> None:
    # without constraints, some of these seeds end the output inside reasoning (EOS)
    plain = [chat(server, seed=seed, max_tokens=60) for seed in range(4)]
    assert any(r["choices"][0]["message"]["content"] in (None, "") for r in plain)
    for seed in range(4):
        reply = chat(server, seed=seed, max_tokens=60, response_format=JSON_FORMAT)
        assert json.loads(reply["choices"][0]["message"]["content"])["city"] in ("Paris", "Rome")


def test_forced_tool_call_follows_the_budget(server: Server, long_thinker: int) -> None:
    reply = chat(
        server,
        seed=long_thinker,
        max_tokens=200,
        tools=[WEATHER],
        tool_choice="required",
        reasoning_effort="low",
        max_thinking_tokens=5,
    )
    assert reasoning_tokens(reply) <= 5
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_responses_budget(server: Server, long_thinker: int) -> None:
    body = {
        "input": ASK,
        "temperature": 2,
        "top_k": -1,
        "top_p": 1,
        "seed": long_thinker,
        "reasoning": {"effort": "high"},
        "max_thinking_tokens": 6,
        "max_output_tokens": 60,
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": CITY}},
        "store": False,
    }
    reply = post(server, "/v1/responses", body)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["usage"]["output_tokens_details"]["reasoning_tokens"] <= 6
    message = next(i for i in data["output"] if i["type"] == "message")
    assert json.loads(message["content"][0]["text"])["city"] in ("Paris", "Rome")


def test_anthropic_budget(server: Server) -> None:
    body = {
        "messages": ASK,
        "max_tokens": 60,
        "temperature": 1,
        "top_k": 0,
        "thinking": {"type": "enabled", "budget_tokens": 1},
        "output_config": {"format": {"type": "json_schema", "schema": CITY}},
    }
    for _ in range(3):
        reply = post(server, "/v1/messages", body)
        assert reply.status_code == 200, reply.text
        blocks = reply.json()["content"]
        # a budget of one token is the closing tag itself: no thought, then the answer
        assert all(b["type"] != "thinking" or not b["thinking"] for b in blocks)
        text = next(b["text"] for b in blocks if b["type"] == "text")
        assert json.loads(text)["city"] in ("Paris", "Rome")


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {"messages": ASK, "max_thinking_tokens": 0},
            "max_thinking_tokens",
        ),
        (
            "/v1/chat/completions",
            {"messages": ASK, "max_thinking_tokens": "x"},
            "max_thinking_tokens",
        ),
        ("/v1/chat/completions", {"messages": ASK, "reasoning_effort": "huge"}, "reasoning_effort"),
        ("/v1/responses", {"input": "hi", "max_thinking_tokens": -1}, "max_thinking_tokens"),
        ("/v1/responses", {"input": "hi", "reasoning": {"effort": "lots"}}, "reasoning.effort"),
    ],
)
def test_bad_openai_budgets_are_400_naming_the_field(
    server: Server, path: str, body: dict[str, Any], param: str
) -> None:
    reply = post(server, path, body)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("thinking", "max_tokens"),
    [
        ({"type": "enabled", "budget_tokens": 0}, 64),
        ({"type": "enabled"}, 64),
        ({"type": "enabled", "budget_tokens": 64}, 64),
    ],
)
def test_bad_anthropic_budgets_are_400_naming_the_field(
    server: Server, thinking: dict[str, Any], max_tokens: int
) -> None:
    body = {"messages": ASK, "max_tokens": max_tokens, "thinking": thinking}
    reply = post(server, "/v1/messages", body)
    assert reply.status_code == 400
    assert "thinking.budget_tokens" in reply.json()["error"]["message"]


# -- the mapping, in process ----------------------------------------------------------------------


def _chat(**fields: Any):
    return chat_job(ChatCompletionRequest(messages=ASK, **fields))


@pytest.mark.parametrize("effort", sorted(EFFORT_BUDGETS))
def test_reasoning_effort_levels_are_budgets(effort: str) -> None:
    job = _chat(reasoning_effort=effort)
    assert job.enable_thinking is True
    assert job.sampling["max_thinking_tokens"] == EFFORT_BUDGETS[effort]


def test_budget_mapping_rules() -> None:
    assert EFFORT_BUDGETS["low"] < EFFORT_BUDGETS["medium"] < EFFORT_BUDGETS["high"]
    for effort in ("none", "minimal"):
        job = _chat(reasoning_effort=effort)
        assert job.enable_thinking is False and job.sampling["max_thinking_tokens"] is None
    explicit = _chat(reasoning_effort="high", max_thinking_tokens=7)
    assert explicit.sampling["max_thinking_tokens"] == 7
    unset = _chat()
    assert unset.enable_thinking is None and unset.sampling["max_thinking_tokens"] is None
    assert _chat(reasoning_effort="low", enable_thinking=False).enable_thinking is False


def _messages(thinking: dict[str, Any] | None):
    return anthropic_job(
        MessagesRequest(model="m", messages=ASK, max_tokens=100, thinking=thinking)
    )


def test_anthropic_thinking_mapping() -> None:
    enabled = _messages({"type": "enabled", "budget_tokens": 12})
    assert enabled.enable_thinking is True and enabled.sampling["max_thinking_tokens"] == 12
    for thinking in (None, {"type": "disabled"}):
        job = _messages(thinking)
        assert job.enable_thinking is False and job.sampling["max_thinking_tokens"] is None
    adaptive = _messages({"type": "adaptive"})
    assert adaptive.enable_thinking is True and adaptive.sampling["max_thinking_tokens"] is None
    with pytest.raises(ApiError, match=r"thinking\.budget_tokens"):
        _messages({"type": "enabled", "budget_tokens": 100})


# -- the engine, in process -----------------------------------------------------------------------


def test_a_closing_tag_of_several_tokens_is_written_whole(artifact) -> None:
    """A vocabulary without a single ``</think>`` token: the budget writes all its pieces."""
    from ninfer_runtime.engine import Engine, GenerationRequest
    from ninfer_runtime.frontend import SamplingParams

    engine = Engine(artifact, max_context=256)
    tokenizer = engine.tokenizer
    pieces = (*tokenizer.encode("</"), *tokenizer.encode("think>"))
    assert len(pieces) > 1
    tokenizer.think_close_ids = pieces
    for seed in range(32):
        sampling = SamplingParams(
            temperature=2, seed=seed, max_tokens=24, ignore_eos=True, max_thinking_tokens=10
        )
        request = GenerationRequest(messages=ASK, enable_thinking=True, sampling=sampling)
        ids, result, finished = generate_all(engine, request)
        assert finished is not None
        if tokenizer.special.think_close not in ids[:10]:  # the model did not close it itself
            break
    else:
        raise AssertionError("every seed closed the reasoning by itself")
    assert tuple(ids[10 - len(pieces) : 10]) == pieces
    assert finished.usage.reasoning_tokens == 10
    assert "</" not in result.reasoning and result.content


@pytest.mark.parametrize("value", [0, -3, "8", 2.5, True])
def test_sampling_params_check_the_budget(value: Any) -> None:
    from ninfer_runtime.errors import RequestError
    from ninfer_runtime.frontend import SamplingParams

    with pytest.raises(RequestError, match="max_thinking_tokens") as error:
        SamplingParams(max_thinking_tokens=value)
    assert error.value.param == "max_thinking_tokens"
