"""HTTP rules: auth, request ids, body limit, bad JSON and types, start-up refusals, config."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from ninfer_serve.config import ConfigError, load_settings

from .conftest import ROOT, Server, start_server

KEY = "sk-test-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(artifact, "--api-key", KEY, "--max-request-mib", "0.01")


def openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert response.headers["x-request-id"]
    return error


def anthropic_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["request_id"] == response.headers["request-id"]
    return body["error"]


def test_auth(server):
    url = server.url
    assert url.startswith("http://127.0.0.1:")  # loopback unless --host says otherwise
    assert httpx.get(f"{url}/health").status_code == 200  # open, for load balancers
    assert openai_error(httpx.get(f"{url}/v1/models"), 401)["code"] == "invalid_api_key"
    wrong = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer nope"})
    openai_error(wrong, 401)
    assert httpx.get(f"{url}/v1/models", headers=AUTH).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers={"x-api-key": KEY}).status_code == 200
    assert httpx.get(f"{url}/metrics").status_code == 401
    body = {"model": server.model, "max_tokens": 4, "messages": CHAT["messages"]}
    error = anthropic_error(httpx.post(f"{url}/v1/messages", json=body), 401)
    assert error["type"] == "authentication_error"
    ok = httpx.post(f"{url}/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=30)
    assert ok.status_code == 200 and ok.json()["type"] == "message"


def test_request_ids(server):
    mine = httpx.get(f"{server.url}/health", headers={"x-request-id": "trace-42"})
    assert mine.headers["x-request-id"] == mine.headers["request-id"] == "trace-42"
    a = httpx.get(f"{server.url}/health").headers["x-request-id"]
    b = httpx.get(f"{server.url}/health").headers["x-request-id"]
    assert a != b


def test_body_limit_is_checked_before_parsing(server):
    big = b"{" + b" " * 20_000  # not even JSON: refused on size, never parsed
    error = openai_error(
        httpx.post(f"{server.url}/v1/chat/completions", content=big, headers=AUTH), 413
    )
    assert error["code"] == "request_too_large"
    anthropic = httpx.post(f"{server.url}/v1/messages", content=big, headers=AUTH)
    assert anthropic_error(anthropic, 413)["type"] == "request_too_large"


def test_bad_json_and_wrong_types(server):
    url = f"{server.url}/v1/chat/completions"
    openai_error(httpx.post(url, content=b"{nope", headers=AUTH), 400)
    openai_error(httpx.post(url, content=b"", headers=AUTH), 400)
    openai_error(httpx.post(url, content=b"[1, 2]", headers=AUTH), 400)
    error = openai_error(httpx.post(url, json={**CHAT, "temperature": "hot"}, headers=AUTH), 400)
    assert error["param"] == "temperature" and error["type"] == "invalid_request_error"
    error = openai_error(
        httpx.post(url, json={"messages": [{"role": "wizard", "content": "x"}]}, headers=AUTH),
        400,
    )
    assert error["param"] == "messages.0.role"
    error = openai_error(httpx.post(url, json={**CHAT, "top_p": 7}, headers=AUTH), 400)
    assert error["param"] == "top_p"
    error = openai_error(httpx.post(url, json={**CHAT, "model": "gpt-9"}, headers=AUTH), 404)
    assert error["code"] == "model_not_found"
    openai_error(httpx.get(f"{server.url}/v1/nothing", headers=AUTH), 404)
    openai_error(httpx.get(url, headers=AUTH), 405)
    body = {"model": server.model, "max_tokens": "many", "messages": CHAT["messages"]}
    anthropic_error(httpx.post(f"{server.url}/v1/messages", json=body, headers=AUTH), 400)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AAAA"}}  # fmt: skip
    body = {"model": server.model, "max_tokens": 4,
            "messages": [{"role": "user", "content": [image]}]}  # fmt: skip
    anthropic_error(httpx.post(f"{server.url}/v1/messages", json=body, headers=AUTH), 400)


def test_openapi_schema_is_published(server):
    schema = httpx.get(f"{server.url}/openapi.json", headers=AUTH).json()
    assert {"/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/models"} <= set(
        schema["paths"]
    )


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ninfer_serve", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def test_refuses_non_loopback_without_key(artifact):
    started = time.monotonic()
    result = run_cli(str(artifact), "--host", "0.0.0.0")
    assert result.returncode == 2
    assert "without an API key" in result.stderr and "--allow-insecure" in result.stderr
    assert time.monotonic() - started < 30


def test_config_errors_name_the_key(artifact, tmp_path):
    config = tmp_path / "ninfer.toml"
    config.write_text("[engine]\nmax_concurency = 2\n")
    result = run_cli(str(artifact), "--config", str(config))
    assert result.returncode == 2 and "unknown key 'engine.max_concurency'" in result.stderr
    config.write_text("[speculative]\nmethod = 'dflash'\n")
    result = run_cli(str(artifact), "--config", str(config))
    assert result.returncode == 2 and "'dflash' is not available yet" in result.stderr
    result = run_cli(str(artifact), "--draft-tokens", "2")
    assert result.returncode == 2 and "draft_tokens needs method 'mtp'" in result.stderr
    result = run_cli(str(artifact), "--max-concurrency", "65")
    assert result.returncode == 2 and "max_concurrency" in result.stderr
    assert run_cli(str(tmp_path / "missing.ninfer")).returncode == 2
    help_text = run_cli("--help").stdout
    assert "--max-pending-requests" in help_text and "Examples" in help_text


def test_flags_win_over_the_file(tmp_path):
    config = tmp_path / "ninfer.toml"
    config.write_text(
        "[server]\nport = 9000\nhost = '127.0.0.1'\n[engine]\nmax_concurrency = 4\n"
        "max_context = 4096\n[context_cache]\nenabled = false\n"
    )
    settings = load_settings(config, {"engine": {"max_concurrency": 2, "max_context": None}})
    assert settings.engine.max_concurrency == 2
    assert settings.engine.max_context == 4096
    assert settings.server.port == 9000
    config.write_text("[server]\nport = 'x'\n")
    with pytest.raises(ConfigError, match=r"server\.port"):
        load_settings(config, {})
    config.write_text("[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(config, {})


def test_ctrl_c_drains_a_running_request(artifact):
    server = Server(artifact, "--max-context", "4096")
    body = {**CHAT, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{server.url}/v1/chat/completions", json=body) as response,
    ):
        lines = response.iter_lines()
        next(lines)
        server.process.send_signal(signal.SIGINT)
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    finish = [json.loads(x[6:]) for x in rest if x.startswith("data: {")][-1]
    assert finish["choices"][0]["finish_reason"] == "length"  # finished, not cut off
    assert server.process.wait(30) == 0
    assert "stopped" in server.log
