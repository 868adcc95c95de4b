"""Transport and admission defects: error shapes and codes, hostile bodies, limits, shutdown.

One server with one lane and one pending slot, so admission outcomes are exact, and a body
limit large enough (32 MiB) that a 16 MB prompt reaches the context check.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import gc
import json
import logging
import signal
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from ninfer_serve.config import BODY_BYTES_PER_TOKEN, ConfigError, fit_to_model, load_settings
from ninfer_serve.errors import from_exception
from ninfer_serve.http import until_disconnect

from .conftest import ROOT, Server, metric, start_server, wait_for
from .test_admission import Long
from .test_http import run_cli

CONTEXT = 1024
POSTS = (
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/responses/input_tokens",
    "/v1/messages",
    "/v1/messages/count_tokens",
)
HELLO = [{"role": "user", "content": "Hello!"}]


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(
        artifact,
        "--max-context", str(CONTEXT),
        "--max-concurrency", "1",
        "--max-pending-requests", "1",
        "--pending-timeout-ms", "4000",
        "--max-request-mib", "32",
    )  # fmt: skip


def error_code(response: httpx.Response, path: str) -> str:
    """The error's code; fails unless the body is the path's API error shape with one."""
    body = response.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] and body["error"]["message"]
        assert body["request_id"] == response.headers["request-id"]
        return body["error"]["type"]
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["code"], str) and body["error"]["code"], body
    return body["error"]["code"]


def test_metrics_content_type_is_the_exposition_type_once(server):
    response = httpx.get(f"{server.url}/metrics")
    assert response.headers.get_list("content-type") == [CONTENT_TYPE_PLAIN_0_0_4]
    assert response.headers["content-type"].count("charset") == 1


@pytest.mark.parametrize("path", POSTS)
def test_deeply_nested_json_is_a_400(server, path):
    depth = 1000
    bodies = [
        b'{"messages":' + b"[" * depth + b"]" * depth + b"}",  # valid, too deep
        b'{"messages":' + b"[" * depth,  # truncated
        b'{"input":' + b'{"a":' * depth,
    ]
    for body in bodies:
        response = httpx.post(server.url + path, content=body, timeout=30)
        assert response.status_code == 400, response.text
        error_code(response, path)
    # deep but within the decoder's reach, inside fields that take any JSON: never a 500
    nested = json.loads("[" * 900 + "]" * 900)
    deep_fields = {
        "/v1/chat/completions": {"messages": HELLO, "chat_template_kwargs": {"x": nested}},
        "/v1/responses": {"input": [{"type": "message", "role": "user", "content": nested}]},
        "/v1/responses/input_tokens": {"input": [{"type": "reasoning", "summary": nested}]},
        "/v1/messages": {
            "model": server.model,
            "max_tokens": 2,
            "messages": HELLO,
            "metadata": {"x": nested},
        },
        "/v1/messages/count_tokens": {
            "model": server.model,
            "messages": HELLO,
            "tools": [{"name": "t", "input_schema": {"x": nested}}],
        },
    }
    response = httpx.post(server.url + path, json=deep_fields[path], timeout=30)
    assert response.status_code < 500, response.text


@pytest.mark.parametrize("key", ["summary", "content"])
@pytest.mark.parametrize("value", ["abc", 5, {"text": "x"}, ["abc"], [{"text": 5}]])
def test_reasoning_item_parts_must_be_a_list_of_text_parts(server, key, value):
    item = {"type": "reasoning", key: value}
    body = {"input": [item, {"type": "message", "role": "user", "content": "Hi"}]}
    response = httpx.post(f"{server.url}/v1/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert error_code(response, "/v1/responses") == "invalid_request"
    assert response.json()["error"]["param"].startswith(f"input[0].{key}")


def test_every_api_error_in_the_source_has_a_code():
    missing = []
    for path in sorted((ROOT / "ninfer_serve").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "ApiError"
                and not any(k.arg in ("code", None) for k in node.keywords)
            ):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing, missing


def test_client_errors_all_carry_a_code(server):
    url = server.url
    cases = [
        ("/v1/responses", {"input": []}),
        ("/v1/responses", {"input": "x", "tool_choice": "required"}),
        ("/v1/responses", {"input": "x", "text": {"format": {"type": "json_schema"}}}),
        ("/v1/responses", {"input": [5]}),
        ("/v1/responses", {"input": [{"type": "message", "role": "user", "content": 5}]}),
        ("/v1/chat/completions", {"messages": HELLO, "stop": ["a"] * 17}),
        ("/v1/chat/completions", {"messages": HELLO, "tool_choice": "required"}),
        (
            "/v1/chat/completions",
            {"messages": HELLO, "response_format": {"type": "json_schema"}},
        ),
        (
            "/v1/messages",
            {
                "model": server.model,
                "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}],
            },
        ),
    ]
    for path, body in cases:
        response = httpx.post(url + path, json=body, timeout=30)
        assert response.status_code == 400, (path, body, response.text)
        error_code(response, path)


def test_a_500_logs_its_traceback(caplog):
    def broken() -> None:
        raise ZeroDivisionError("boom")

    try:
        broken()
    except ZeroDivisionError as exc:
        with caplog.at_level(logging.ERROR, logger="ninfer_serve"):
            error = from_exception(exc)
    assert error.status == 500 and "server log" in error.message
    record = next(r for r in caplog.records if r.exc_info)
    assert "in broken" in caplog.text and record.exc_info[0] is ZeroDivisionError


def test_a_huge_prompt_is_refused_at_once_while_health_answers(server):
    body = {"messages": [{"role": "user", "content": "lorem ipsum " * 1_400_000}]}
    payload = json.dumps(body).encode()
    assert len(payload) > 16_000_000
    probes: list[float] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=5) as client:
            while not done.is_set():
                started = time.monotonic()
                assert client.get(f"{server.url}/health").status_code == 200
                probes.append(time.monotonic() - started)
                time.sleep(0.05)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        started = time.monotonic()
        response = httpx.post(f"{server.url}/v1/chat/completions", content=payload, timeout=30,
                              headers={"content-type": "application/json"})  # fmt: skip
        took = time.monotonic() - started
    finally:
        done.set()
        prober.join()
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and "at least" in error["message"]
    assert took < 5, took
    assert probes and max(probes) < 1.0, probes


def test_counting_takes_an_admission_ticket(server):
    long = Long(server.url)  # the lane
    queued = ThreadPoolExecutor(1).submit(  # the pending slot
        httpx.post, f"{server.url}/v1/chat/completions",
        json={"messages": HELLO, "max_tokens": 2}, timeout=30,
    )  # fmt: skip
    try:
        assert wait_for(lambda: metric(server.url, "ninfer_requests_waiting") == 1, timeout=5)
        body = {"model": server.model, "messages": HELLO}
        counted = httpx.post(f"{server.url}/v1/messages/count_tokens", json=body, timeout=10)
        assert counted.status_code == 529, counted.text
        counted = httpx.post(f"{server.url}/v1/responses/input_tokens", json={"input": "Hi"})
        assert counted.status_code == 429 and counted.json()["error"]["code"] == "server_overloaded"
    finally:
        long.close()
    assert queued.result().status_code == 200
    body = {"model": server.model, "messages": HELLO}
    counted = httpx.post(f"{server.url}/v1/messages/count_tokens", json=body, timeout=10)
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0


def cancelled(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    for line in text.splitlines():
        if line.startswith('ninfer_requests_total{outcome="cancelled"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_request_leaving_the_queue_is_counted(server):
    before = cancelled(server.url)
    long = Long(server.url)
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/chat/completions", json={"messages": HELLO}, timeout=0.5)
        assert wait_for(lambda: metric(server.url, "ninfer_requests_waiting") == 0, timeout=2)
    finally:
        long.close()
    # the queued one, and the long one cancelled by its disconnect
    assert wait_for(lambda: cancelled(server.url) == before + 2, timeout=5)


def test_a_long_model_name_is_not_echoed_whole(server):
    body = {"model": "m" * 2_000_000, "messages": HELLO}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 404 and len(response.content) < 1000
    assert "2000000 characters" in response.json()["error"]["message"]


def test_405_names_the_allowed_methods_and_the_schema_documents_404(server):
    response = httpx.get(f"{server.url}/v1/chat/completions")
    assert response.status_code == 405 and "POST" in response.headers["allow"]
    assert error_code(response, "/v1/chat/completions") == "method_not_allowed"
    schema = httpx.get(f"{server.url}/openapi.json").json()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            can_404 = "{" in path or method == "post"
            if can_404:
                assert "404" in operation["responses"], (method, path)


def test_max_context_is_checked_against_the_model(artifact, tmp_path):
    result = run_cli(str(artifact), "--max-context", "100000")
    assert result.returncode == 2
    (line,) = [x for x in result.stderr.splitlines() if "error" in x]
    assert "100000" in line and "4096 positions" in line
    config = tmp_path / "ninfer.toml"
    config.write_text("[engine]\nmax_context = 5000\n")
    result = run_cli(str(artifact), "--config", str(config))
    assert result.returncode == 2 and "max_context 5000" in result.stderr


def test_default_context_is_clamped_and_insecure_warns(artifact):
    server = Server(artifact, "--host", "0.0.0.0", "--allow-insecure")
    try:
        assert "max_context 4096" in server.log
        assert server.log.count("without an API key") == 1
        url = server.url.replace("0.0.0.0", "127.0.0.1")
        models = httpx.get(f"{url}/v1/models").json()
        assert models["data"][0]["max_model_len"] == 4096
    finally:
        assert server.stop() == 0


def test_shutdown_answers_running_and_queued_requests_in_json(artifact, tmp_path: Path):
    config = tmp_path / "ninfer.toml"
    config.write_text("[server]\ndrain_timeout_s = 0.5\n")
    # one lane, so the second request is queued behind the first
    server = Server(
        artifact, "--config", str(config), "--max-context", str(CONTEXT), "--max-concurrency", "1"
    )
    body = {"messages": HELLO, "max_tokens": 1000, "ignore_eos": True}
    url = f"{server.url}/v1/chat/completions"
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(httpx.post, url, json=body, timeout=30)
        assert wait_for(lambda: metric(server.url, "ninfer_requests_running") == 1, timeout=5)
        queued = pool.submit(httpx.post, url, json=body, timeout=30)
        assert wait_for(lambda: metric(server.url, "ninfer_requests_waiting") == 1, timeout=5)
        server.process.send_signal(signal.SIGINT)
        answers = [running.result(), queued.result()]
    assert server.process.wait(30) == 0
    for response in answers:
        assert response.status_code == 503, response.text
        assert response.headers["content-type"] == "application/json"
        assert error_code(response, "/v1/chat/completions") == "service_unavailable"
    assert "Traceback" not in server.log, server.log


def test_context_and_body_limit_follow_the_model():
    settings = load_settings(None, {"server": {"max_images_per_request": 0}})
    fit_to_model(settings, 4096)
    assert settings.engine.max_context == 4096  # the default, clamped
    assert settings.max_request_bytes == 1024 * 1024  # at least 1 MiB
    settings = load_settings(
        None, {"engine": {"max_context": 262144}, "server": {"max_images_per_request": 0}}
    )
    fit_to_model(settings, 262144)
    assert settings.max_request_bytes == 262144 * BODY_BYTES_PER_TOKEN
    settings = load_settings(None, {"server": {"max_request_mib": 2}})
    assert settings.max_request_bytes == 2 * 1024 * 1024  # explicit: as given
    settings = load_settings(None, {"engine": {"max_context": 4097}})
    with pytest.raises(ConfigError, match="4097 is more than the model's 4096 positions"):
        fit_to_model(settings, 4096)


def test_a_refused_request_frees_its_data_at_once():
    """No reference cycle keeps a failed request's data until the next full collection (16 MB
    prompts refused one after another used to pile up)."""

    class Prompt:
        pass

    class Connected:
        async def receive(self) -> dict:
            await asyncio.Event().wait()
            return {}

    async def refuse(prompt: Prompt) -> None:
        raise ValueError("refused")

    async def serve_one() -> weakref.ref:
        prompt = Prompt()
        alive = weakref.ref(prompt)
        with contextlib.suppress(ValueError):
            await until_disconnect(Connected(), refuse(prompt))  # type: ignore[arg-type]
        del prompt
        return alive

    gc.disable()
    try:
        assert asyncio.run(serve_one())() is None
    finally:
        gc.enable()
