"""Bounds on what a request can cost the server: short error bodies whatever the input, cheap
refusals before tokenizing, one stop-string limit for every API, refusals before a stream."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from ninfer_runtime.engine import SHORT_CHUNK_TOKENS
from ninfer_runtime.models import load_model
from ninfer_runtime.state import PAGE_TOKENS, ContextPool
from ninfer_serve.limits import MAX_STOP

from .conftest import Server, start_server

CONTEXT = 4096
POOL_PAGES = 4  # 1,024 tokens: a prompt can fit the context and never the pool
HELLO = [{"role": "user", "content": "Hello!"}]
#: a prompt of about 1,500 tokens: within CONTEXT, beyond the pool
OVER_THE_POOL = [{"role": "user", "content": "hello " * 1500}]
#: the most bytes an error body may have (the server promises a few KiB)
MOST_ERROR_BYTES = 4096


def pool_capacity(artifact) -> int:
    """Bytes of a pool with one lane's state slot and POOL_PAGES pages."""
    specs, mtp = load_model(artifact).state_specs()
    page = ContextPool.page_bytes_of(specs, mtp, PAGE_TOKENS, "float32")
    return ContextPool.slot_bytes_of(specs, step_rows=SHORT_CHUNK_TOKENS) + POOL_PAGES * page


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(
        artifact,
        "--max-context", str(CONTEXT),
        "--max-concurrency", "1",
        "--context-capacity", str(pool_capacity(artifact)),
        "--max-request-mib", "2",
    )  # fmt: skip


def post(server: Server, path: str, body: dict | bytes) -> tuple[httpx.Response, float]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    started = time.monotonic()
    response = httpx.post(server.url + path, content=content, timeout=60,
                          headers={"content-type": "application/json"})  # fmt: skip
    return response, time.monotonic() - started


def openai_error(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text[:2000]
    assert len(response.content) <= MOST_ERROR_BYTES, len(response.content)
    return response.json()["error"]


def anthropic_error(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text[:2000]
    assert len(response.content) <= MOST_ERROR_BYTES, len(response.content)
    body = response.json()
    assert body["type"] == "error" and body["request_id"] == response.headers["request-id"]
    assert body["error"]["type"] == "invalid_request_error"
    return body["error"]


# -- error bodies -----------------------------------------------------------------------------


def many_integers(prefix: str) -> bytes:
    """A 1 MiB body: ``prefix`` (JSON members) then ``messages`` of 524,000 integers."""
    return b'{%s"messages":[%s]}' % (prefix.encode(), b",".join([b"1"] * 524_000))


@pytest.mark.parametrize(
    "path, prefix",
    [
        ("/v1/chat/completions", ""),
        ("/v1/messages", '"model":"tiny","max_tokens":4,'),
        ("/v1/messages/count_tokens", '"model":"tiny",'),
    ],
)
def test_half_a_million_bad_items_get_a_short_error_at_once(server, path, prefix):
    body = many_integers(prefix.replace("tiny", server.model))
    assert len(body) > 1_000_000
    response, took = post(server, path, body)
    error = anthropic_error(response) if "messages" in path else openai_error(response)
    assert "messages.0" in error["message"]
    assert took < 1.0, took


def test_responses_input_of_many_bad_items_gets_a_short_error(server):
    body = b'{"input":[%s]}' % b",".join([b"1"] * 524_000)
    response, took = post(server, "/v1/responses", body)
    error = openai_error(response)
    assert error["param"].startswith("input") and error["code"] == "invalid_request"
    assert took < 1.0, took


def test_many_unknown_fields_are_one_counted_problem(server):
    fields = {f"extra_{i}": 1 for i in range(100_000)}
    response, took = post(server, "/v1/responses", {"input": "Hi", **fields})
    error = openai_error(response)
    assert "100000 unknown fields" in error["message"] and "'extra_0'" in error["message"]
    assert took < 1.0, took


def test_a_few_problems_are_listed_and_the_rest_counted(server):
    fields = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
              "frequency_penalty", "max_tokens")  # fmt: skip
    body = {"messages": HELLO, **{name: "a string" for name in fields}}
    error = openai_error(post(server, "/v1/chat/completions", body)[0])
    # the first five by name, the other three as a count
    assert sum(f"{name}:" in error["message"] for name in fields) == 5
    assert error["message"].endswith("(and 3 more)")
    assert error["param"] in fields


def test_an_echoed_value_is_cut(server):
    huge = "k" * 500_000
    error = openai_error(post(server, "/v1/responses", {"input": "Hi", huge: 1})[0])
    assert "characters" in error["param"] and len(error["param"]) <= 256
    body = {
        "model": server.model,
        "max_tokens": 4,
        "messages": HELLO,
        "tools": [{"name": "t", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": huge},
    }
    error = anthropic_error(post(server, "/v1/messages", body)[0])
    assert error["message"].endswith("is not in tools")
    body = {"model": server.model, "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": huge}]}]}  # fmt: skip
    assert "characters" in anthropic_error(post(server, "/v1/messages", body)[0])["message"]


# -- count_tokens with thinking ---------------------------------------------------------------


@pytest.mark.parametrize("max_tokens", ["100", [100], {"n": 100}, True])
def test_count_tokens_with_thinking_and_a_max_tokens_of_another_type(server, max_tokens):
    body = {
        "model": server.model,
        "messages": HELLO,
        "thinking": {"type": "enabled", "budget_tokens": 10},
        "max_tokens": max_tokens,
    }
    error = anthropic_error(post(server, "/v1/messages/count_tokens", body)[0])
    assert "max_tokens" in error["message"]


def test_count_tokens_checks_the_thinking_budget_against_max_tokens(server):
    body = {"model": server.model, "messages": HELLO,
            "thinking": {"type": "enabled", "budget_tokens": 10}}  # fmt: skip
    error = anthropic_error(post(server, "/v1/messages/count_tokens", {**body, "max_tokens": 5})[0])
    assert "budget_tokens" in error["message"]
    counted = post(server, "/v1/messages/count_tokens", {**body, "max_tokens": 50})[0]
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0


# -- a prompt that can never fit the context pool ---------------------------------------------


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/chat/completions", {"messages": OVER_THE_POOL, "max_tokens": 2}),
        ("/v1/messages", {"messages": OVER_THE_POOL, "max_tokens": 2}),
        ("/v1/responses", {"input": OVER_THE_POOL[0]["content"], "max_output_tokens": 2}),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_beyond_the_pool_is_a_400_before_any_event(server, path, body, stream):
    if path == "/v1/messages":
        body = {**body, "model": server.model}
    response = post(server, path, {**body, "stream": stream})[0]
    assert response.headers["content-type"].startswith("application/json"), response.text[:300]
    if path == "/v1/messages":
        error = anthropic_error(response)
    else:
        error = openai_error(response)
        assert error["code"] == "context_length_exceeded"
        assert error["param"] == ("input" if path == "/v1/responses" else "messages")
    assert "context pool" in error["message"]


# -- tool definitions -------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": "Looks something up in the catalogue of things. " * 4,
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
    for i in range(3000)
]


def test_thousands_of_tools_are_refused_before_tokenizing(server):
    body = {"messages": HELLO, "tools": TOOLS, "max_tokens": 2}
    response, took = post(server, "/v1/chat/completions", body)
    error = openai_error(response)
    assert error["code"] == "context_length_exceeded" and error["param"] == "tools"
    assert "has at least" in error["message"]  # the bound before tokenizing, not the count after
    assert took < 1.0, took
    anthropic_tools = [
        {"name": t["function"]["name"], "description": t["function"]["description"],
         "input_schema": t["function"]["parameters"]}
        for t in TOOLS
    ]  # fmt: skip
    body = {"model": server.model, "messages": HELLO, "tools": anthropic_tools}
    response, took = post(server, "/v1/messages/count_tokens", body)
    assert "has at least" in anthropic_error(response)["message"]
    assert took < 1.0, took


def test_a_few_tools_still_work(server):
    body = {"messages": HELLO, "tools": TOOLS[:2], "max_tokens": 2}
    assert post(server, "/v1/chat/completions", body)[0].status_code == 200


# -- stop strings -----------------------------------------------------------------------------


def test_one_stop_limit_for_every_api(server):
    too_many = [f"stop {i}" for i in range(MAX_STOP + 1)]
    chat = {"messages": HELLO, "max_tokens": 2}
    error = openai_error(post(server, "/v1/chat/completions", {**chat, "stop": too_many})[0])
    assert error["param"] == "stop" and error["code"] == "invalid_value"
    messages = {"model": server.model, "messages": HELLO, "max_tokens": 2}
    for stops in (too_many, ["x"] * 5000):
        error = anthropic_error(
            post(server, "/v1/messages", {**messages, "stop_sequences": stops})[0]
        )
        assert f"at most {MAX_STOP}" in error["message"] and "stop_sequences" in error["message"]
    at_most = too_many[:MAX_STOP]
    ok = post(server, "/v1/messages", {**messages, "stop_sequences": at_most})[0]
    assert ok.status_code == 200, ok.text
    ok = post(server, "/v1/chat/completions", {**chat, "stop": at_most})[0]
    assert ok.status_code == 200, ok.text
    # the published schema states the same limit for both
    schemas = httpx.get(server.url + "/openapi.json", timeout=10).json()["components"]["schemas"]
    stop = schemas["ChatCompletionRequest"]["properties"]["stop"]
    chat_limit = stop["anyOf"][0]["anyOf"][1]["maxItems"]
    sequences = schemas["MessagesRequest"]["properties"]["stop_sequences"]
    assert chat_limit == sequences["anyOf"][0]["maxItems"] == MAX_STOP


# -- the field an over-long prompt is blamed on ------------------------------------------------


def test_responses_blames_input_for_an_over_long_prompt(server):
    # beyond the bound before tokenizing
    body = {"input": "hello " * 100_000, "max_output_tokens": 2}
    error = openai_error(post(server, "/v1/responses", body)[0])
    assert error["code"] == "context_length_exceeded" and "has at least" in error["message"]
    assert error["param"] == "input" and error["message"].endswith("shorten the input.")
    counted = post(server, "/v1/responses/input_tokens", {"input": body["input"]})[0]
    assert openai_error(counted)["param"] == "input"
    # within the bound, beyond the context once tokenized
    body = {"input": "hello " * (CONTEXT + 500), "max_output_tokens": 2}
    error = openai_error(post(server, "/v1/responses", body)[0])
    assert error["code"] == "context_length_exceeded" and "has at least" not in error["message"]
    assert error["param"] == "input"
