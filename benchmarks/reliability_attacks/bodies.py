"""The ``bodies`` family: malformed bodies to every POST endpoint of the live server (deep
nesting, truncation, huge strings, every field given every wrong type, non-UTF-8).

A failure is a 5xx, a hang, an error body that is not the protocol's JSON error shape with a
code, or one that echoes the input (over 64 KiB).
"""

from __future__ import annotations

import copy
import json
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .bookkeeping import Budget, Tally, interleaved, short
from .files import random_json_op
from .live_server import ALLOWED_5XX, LiveServer


def _templates(model: str) -> dict[str, dict[str, Any]]:
    """A valid, field-rich body for every POST endpoint (small outputs: the context is 256)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    chat = {
        "model": model, "max_tokens": 4, "temperature": 0.5, "stream": False, "tools": [tool],
        "tool_choice": "auto", "response_format": {"type": "text"}, "stop": ["x"],
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": "ok", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ],
    }  # fmt: skip
    responses = {
        "model": model, "max_output_tokens": 4, "instructions": "be brief", "store": False,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "text": {"format": {"type": "text"}}, "reasoning": {"effort": "low"},
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "summary": [], "content": [
                {"type": "reasoning_text", "text": "think"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
        ],
    }  # fmt: skip
    messages = {
        "model": model, "max_tokens": 4, "system": "be brief", "stop_sequences": ["x"],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto"},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "done"}]},
        ],
    }  # fmt: skip
    completions = {
        "model": model, "prompt": ["hi", "ok"], "max_tokens": 4, "temperature": 0.5, "n": 1,
        "echo": True, "logprobs": 2, "stop": ["x"], "seed": 1, "stream": False,
    }  # fmt: skip
    return {
        "/v1/chat/completions": chat,
        "/v1/completions": completions,
        "/tokenize": {"model": model, "messages": chat["messages"], "return_token_strs": True},
        "/detokenize": {"model": model, "tokens": [1, 2, 3]},
        "/v1/responses": responses,
        "/v1/responses/input_tokens": {k: v for k, v in responses.items() if k != "store"},
        "/v1/responses/resp_0/cancel": {},
        "/v1/messages": messages,
        "/v1/messages/count_tokens": {k: v for k, v in messages.items() if k != "max_tokens"},
    }


def _deep(depth: int, closed: bool = True) -> bytes:
    return b"[" * depth + (b"]" * depth if closed else b"")


def hostile_bodies(rng: random.Random, model: str) -> Iterator[tuple[str, str, bytes]]:
    """(path, description, body) forever: fixed hostile bodies for every endpoint, every field
    of every template given every wrong type, and random mutations, interleaved."""
    from tests.format import test_fuzz as fz

    templates = _templates(model)

    def fixed() -> Iterator[tuple[str, str, bytes]]:
        for path, body in templates.items():
            text = json.dumps(body).encode()
            inner = json.dumps({**body, "messages": "@"}).encode().replace(b'"@"', _deep(1000))
            cases = {
                "1000 nested arrays": _deep(1000),
                "1000 nested arrays, truncated": _deep(1000, closed=False),
                "1000 nested objects": b'{"a":' * 1000 + b"1" + b"}" * 1000,
                "messages nested 1000 deep": inner,
                "empty body": b"",
                "null": b"null",
                "an array": b"[]",
                "a string": b'"x"',
                "truncated at 1 byte": b"{",
                "truncated at half": text[: len(text) // 2],
                "trailing garbage": text + b"x",
                "UTF-16 BOM": b"\xff\xfe" + text,
                "single quotes": text.replace(b'"', b"'"),
                "a 2 MiB model name": json.dumps({**body, "model": "m" * (2 << 20)}).encode(),
                "invalid UTF-8 in a string": text.replace(b"hi", b"h\xffi"),
                "a lone surrogate escape": text.replace(b"hi", b"\\ud800"),
                "raw surrogate bytes": text.replace(b"hi", b"h\xed\xa0\x80i"),
                "a 64 KiB string": text.replace(b"hi", b"h" * (64 << 10)),
            }
            for name, hostile in cases.items():
                yield path, name, hostile

    def wrong_types() -> Iterator[tuple[str, str, bytes]]:
        for path, body in templates.items():
            for where in fz.json_paths(body)[1:]:
                for value in fz.NASTY:
                    mutated = fz.apply(copy.deepcopy(body), ("replace", where, value))
                    yield path, f"{'.'.join(map(str, where))} = {value!r}", fz.dump(mutated)

    def mutations() -> Iterator[tuple[str, str, bytes]]:
        while True:
            path = rng.choice(list(templates))
            body: Any = copy.deepcopy(templates[path])
            ops = []
            for _ in range(rng.randint(1, 3)):
                if isinstance(body, dict | list):
                    ops.append(random_json_op(rng, fz, body))
                    body = fz.apply(body, ops[-1])
            yield path, f"template mutated by {short(ops, 200)}", fz.dump(body)

    return interleaved(fixed(), wrong_types(), mutations())


def attack_bodies(budget: Budget, rng: random.Random, live: LiveServer, tally: Tally) -> None:
    server = live.get()
    bodies = hostile_bodies(rng, server.model)
    lock = threading.Lock()

    def worker() -> None:
        import httpx

        with httpx.Client(base_url=server.url, timeout=30) as client:
            while not budget.spent() or not tally.cases:
                with lock:
                    path, what, body = next(bodies)
                tally.case(_body_problem(client, path, what, body))

    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(worker) for _ in range(2)]:
            future.result()
    answered_500 = sum(f.startswith("500 ") for f in tally.failures)
    logged = len(live.tracebacks())
    if answered_500 > logged:
        tally.fail(f"{answered_500} answers were 500, the server log holds {logged} "
                   "tracebacks (every 500 must log one)")  # fmt: skip


def _body_problem(client: Any, path: str, what: str, body: bytes) -> str | None:
    import httpx

    what = f"POST {path} with {what} ({len(body)} bytes)"
    headers = {"content-type": "application/json"}
    try:
        response = client.post(path, content=body, headers=headers)
    except httpx.TimeoutException:
        return f"no answer within 30 s <- {what}"
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__} <- {what}"
    status = response.status_code
    if status >= 500 and status not in ALLOWED_5XX:
        return f"{status} on {path} <- {what}"
    if status >= 400:
        problem = _error_shape_problem(path, status, response.content)
        return problem and f"{problem} <- {what}"
    return None


def _error_shape_problem(path: str, status: int, body: bytes) -> str | None:
    """The protocol's JSON error shape, with a code (Anthropic: ``error.type``)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return f"{status} body is not JSON: {short(body[:80])}"
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return f"{status} body is not an error object: {short(body[:120])}"
    if path.startswith("/v1/messages"):
        if doc.get("type") != "error" or not error.get("type"):
            return f"{status} body is not Anthropic's error shape: {short(body[:120])}"
    elif not error.get("code"):
        return f"{status} error without a code: {short(body[:160])}"
    if len(body) > 64 * 1024:
        return f"{status} error body of {len(body)} bytes echoes the input"
    return None
