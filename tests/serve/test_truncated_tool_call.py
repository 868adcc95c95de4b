"""A forced tool call cut off by ``max_tokens``: no markup reaches the client, the streamed and
the non-streamed answer are the same, and the reply says it was cut (``length``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import Server, start_server

WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 16}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    },
}
ASK = [{"role": "user", "content": "How is the weather?"}]
#: cuts before the call's name, inside the string value, inside the integer, before the close tags
LIMITS = (3, 45, 75, 88)
MARKUP = ("<tool_call", "<function", "<parameter", "</", "<think")


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(artifact, "--max-concurrency", "2", "--max-context", "2048")


def _sse(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def _post(server: Server, path: str, body: dict[str, Any]) -> Any:
    with httpx.Client(timeout=60) as client:
        if not body.get("stream"):
            reply = client.post(f"{server.url}{path}", json=body)
            assert reply.status_code == 200, reply.text
            return reply.json()
        with client.stream("POST", f"{server.url}{path}", json=body) as reply:
            assert reply.status_code == 200
            return list(_sse(reply))


def chat(server: Server, limit: int, stream: bool, **extra: Any) -> tuple:
    body = {
        **extra,
        "model": server.model,
        "messages": ASK,
        "tools": [{"type": "function", "function": WEATHER}],
        "tool_choice": "required",
        "max_tokens": limit,
        "temperature": 0,
        "enable_thinking": False,
        "stream": stream,
    }
    reply = _post(server, "/v1/chat/completions", body)
    if not stream:
        choice = reply["choices"][0]
        calls = [
            (c["function"]["name"], c["function"]["arguments"])
            for c in choice["message"]["tool_calls"]
        ]
        return choice["message"]["content"] or "", calls, choice["finish_reason"]
    text, calls, finish = "", {}, None
    for chunk in reply:
        for choice in chunk["choices"]:
            finish = choice["finish_reason"] or finish
            text += choice["delta"].get("content") or ""
            for call in choice["delta"].get("tool_calls") or []:
                name, arguments = calls.get(call["index"], ("", ""))
                function = call["function"]
                calls[call["index"]] = (
                    name + (function.get("name") or ""),
                    arguments + (function.get("arguments") or ""),
                )
    return text, [calls[i] for i in sorted(calls)], finish


def responses(server: Server, limit: int, stream: bool) -> tuple:
    body = {
        "model": server.model,
        "input": ASK,
        "tools": [{"type": "function", **WEATHER}],
        "tool_choice": "required",
        "max_output_tokens": limit,
        "temperature": 0,
        "reasoning": {"effort": "none"},
        "store": False,
        "stream": stream,
    }
    reply = _post(server, "/v1/responses", body)
    if not stream:
        return _response_items(reply)
    items: dict[int, dict[str, Any]] = {}
    for event in reply:
        if event["type"] == "response.output_item.added":
            items[event["output_index"]] = {**event["item"], "text": "", "arguments": ""}
        elif event["type"] == "response.output_text.delta":
            items[event["output_index"]]["text"] += event["delta"]
        elif event["type"] == "response.function_call_arguments.delta":
            items[event["output_index"]]["arguments"] += event["delta"]
        elif event["type"] == "response.output_item.done":
            items[event["output_index"]]["status"] = event["item"]["status"]
        elif event["type"] in ("response.completed", "response.incomplete"):
            final = event["response"]
    assert _response_items(final) == _response_items(
        {**final, "output": [i for _, i in sorted(items.items()) if i["status"] != "in_progress"]}
    )
    return _response_items(final)


def _response_items(reply: dict[str, Any]) -> tuple:
    text, calls = "", []
    for item in reply["output"]:
        if item["type"] == "message":
            text += "".join(p["text"] for p in item["content"])
        elif item["type"] == "function_call":
            calls.append((item["name"], item["arguments"], item["status"]))
    reason = (reply.get("incomplete_details") or {}).get("reason")
    return text, calls, reply["status"], reason


def messages(server: Server, limit: int, stream: bool, **extra: Any) -> tuple:
    body = {
        **extra,
        "model": server.model,
        "messages": ASK,
        "tools": [{"name": WEATHER["name"], "input_schema": WEATHER["parameters"]}],
        "tool_choice": {"type": "any"},
        "max_tokens": limit,
        "temperature": 0,
        "stream": stream,
    }
    reply = _post(server, "/v1/messages", body)
    if not stream:
        blocks = [
            (b["type"], b.get("text") or b.get("name"), b.get("input")) for b in reply["content"]
        ]
        return blocks, reply["stop_reason"]
    blocks, reason = [], None
    for event in reply:
        if event["type"] == "content_block_start":
            block = event["content_block"]
            name = block["name"] if block["type"] == "tool_use" else block.get("text", "")
            blocks.append([block["type"], name, ""])
        elif event["type"] == "content_block_delta":
            delta = event["delta"]
            blocks[-1][2] += delta.get("partial_json") or ""
            if delta["type"] == "text_delta":
                blocks[-1][1] += delta["text"]
        elif event["type"] == "message_delta":
            reason = event["delta"]["stop_reason"]
    out = [(k, t, json.loads(j) if k == "tool_use" else None) for k, t, j in blocks]
    return out, reason


@pytest.mark.parametrize("limit", LIMITS)
def test_chat(server: Server, limit: int) -> None:
    plain = chat(server, limit, stream=False)
    assert chat(server, limit, stream=True) == plain
    text, calls, finish = plain
    assert finish == "length"
    assert not any(m in text for m in MARKUP)
    for _, arguments in calls:
        assert isinstance(json.loads(arguments), dict)
    if limit >= 45:
        assert [name for name, _ in calls] == ["get_weather"]


@pytest.mark.parametrize("limit", LIMITS)
def test_responses(server: Server, limit: int) -> None:
    plain = responses(server, limit, stream=False)
    assert responses(server, limit, stream=True) == plain
    text, calls, status, reason = plain
    assert (status, reason) == ("incomplete", "max_output_tokens")
    assert not any(m in text for m in MARKUP)
    assert all(s == "incomplete" and json.loads(a) is not None for _, a, s in calls)
    if limit >= 45:
        assert [name for name, _, _ in calls] == ["get_weather"]


@pytest.mark.parametrize("limit", LIMITS)
def test_messages(server: Server, limit: int) -> None:
    plain = messages(server, limit, stream=False)
    assert messages(server, limit, stream=True) == plain
    blocks, reason = plain
    assert reason == "max_tokens"
    for kind, text, value in blocks:
        assert kind == "tool_use" or not any(m in text for m in MARKUP)
        assert kind != "tool_use" or isinstance(value, dict)
    if limit >= 45:
        assert [b[1] for b in blocks if b[0] == "tool_use"] == ["get_weather"]


def test_a_call_that_fits_is_complete(server: Server) -> None:
    text, calls, finish = chat(server, 400, stream=False)
    assert finish == "tool_calls" and text == ""
    assert set(json.loads(calls[0][1])) == {"city", "days"}


def test_a_stop_string_inside_the_call_cuts_it_the_same_way(server: Server) -> None:
    # the tiny model's city argument starts "The capital"
    plain = chat(server, 400, stream=False, stop=["capital"])
    assert chat(server, 400, stream=True, stop=["capital"]) == plain
    text, calls, finish = plain
    assert finish == "stop" and text == ""
    assert [(name, json.loads(arguments)) for name, arguments in calls] == [
        ("get_weather", {"city": "The "})
    ]
    blocks, reason = messages(server, 400, stream=False, stop_sequences=["capital"])
    assert messages(server, 400, stream=True, stop_sequences=["capital"]) == (blocks, reason)
    assert reason == "stop_sequence"
    assert [b for b in blocks if b[0] == "tool_use"] == [
        ("tool_use", "get_weather", {"city": "The "})
    ]
