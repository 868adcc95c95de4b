"""CORS: off by default; with ``--allowed-origins`` a browser's preflight is answered before the
API key is checked, the allowed origins' responses (errors included) carry the headers a page
needs to read them, other origins' do not, and credentials never go with ``*``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ninfer_serve.config import ConfigError, load_settings
from ninfer_serve.cors import CorsPolicy

from .conftest import ROOT, Server, start_server

PAGE = "http://localhost:3000"
KEY = {"authorization": "Bearer sk-test"}
PREFLIGHT = {
    "access-control-request-method": "POST",
    # what the openai JS SDK asks to send from a browser, and one header nobody allows
    "access-control-request-headers": "authorization, content-type, x-stainless-os, x-custom",
}


@pytest.fixture(scope="module")
def cors_server(artifact) -> Iterator[Server]:
    yield from start_server(
        artifact,
        "--api-key", "sk-test",
        "--allowed-origins", f"{PAGE}, https://app.example.com/",
        "--allow-credentials",
    )  # fmt: skip


@pytest.fixture(scope="module")
def plain_server(artifact) -> Iterator[Server]:
    yield from start_server(artifact)


def cors_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.startswith("access-control-")}


def test_preflight_is_answered_without_the_key(cors_server):
    url = f"{cors_server.url}/v1/chat/completions"
    response = httpx.options(url, headers={"origin": PAGE, **PREFLIGHT}, timeout=10)
    assert response.status_code == 204, response.text
    headers = cors_headers(response)
    assert headers["access-control-allow-origin"] == PAGE
    assert headers["access-control-allow-credentials"] == "true"
    assert "POST" in headers["access-control-allow-methods"]
    allowed = {h.strip() for h in headers["access-control-allow-headers"].split(",")}
    assert allowed == {"authorization", "content-type", "x-stainless-os"}
    assert "Origin" in response.headers["vary"]
    # a stored response's path has its own OPTIONS handler: the preflight is answered anyway
    stored = f"{cors_server.url}/v1/responses/resp_123"
    preflight = {"origin": PAGE, "access-control-request-method": "DELETE"}
    response = httpx.options(stored, headers=preflight, timeout=10)
    assert response.status_code == 204
    assert "DELETE" in response.headers["access-control-allow-methods"]


def test_preflight_from_another_origin_is_refused(cors_server):
    url = f"{cors_server.url}/v1/chat/completions"
    response = httpx.options(url, headers={"origin": "http://evil.test", **PREFLIGHT}, timeout=10)
    assert response.status_code == 403
    assert cors_headers(response) == {}
    assert response.json()["error"]["code"] == "origin_not_allowed"


def test_simple_requests(cors_server):
    models = f"{cors_server.url}/v1/models"
    # an allowed origin (written with another case and a slash in the settings) reads the answer
    ok = httpx.get(models, headers={"origin": "https://app.example.com", **KEY}, timeout=10)
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == "https://app.example.com"
    assert "x-request-id" in ok.headers["access-control-expose-headers"]
    # ... and its errors: a page can tell a wrong key from a network failure
    denied = httpx.get(models, headers={"origin": PAGE}, timeout=10)
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == PAGE
    # another origin is served as any client is, without the headers a browser needs
    other = httpx.get(models, headers={"origin": "http://evil.test", **KEY}, timeout=10)
    assert other.status_code == 200 and cors_headers(other) == {}


def test_off_by_default(plain_server):
    url = f"{plain_server.url}/v1/chat/completions"
    preflight = httpx.options(url, headers={"origin": PAGE, **PREFLIGHT}, timeout=10)
    assert cors_headers(preflight) == {}
    simple = httpx.get(f"{plain_server.url}/v1/models", headers={"origin": PAGE}, timeout=10)
    assert simple.status_code == 200 and cors_headers(simple) == {}


def test_any_origin_without_credentials():
    policy = CorsPolicy(["*"])
    headers = dict(policy.response_headers(b"http://anywhere.test"))
    assert headers[b"access-control-allow-origin"] == b"*"
    assert b"access-control-allow-credentials" not in headers


def test_credentials_with_any_origin_are_refused(tmp_path: Path):
    config = tmp_path / "ninfer.toml"
    config.write_text('[server]\nallowed_origins = ["*"]\nallow_credentials = true\n')
    with pytest.raises(ConfigError, match="allow_credentials cannot go with allowed_origins"):
        load_settings(config, {})
    with pytest.raises(ConfigError, match="origin 'localhost:3000' is not"):
        load_settings(None, {"server": {"allowed_origins": "localhost:3000"}})
    with pytest.raises(ConfigError, match="allow_credentials needs allowed_origins"):
        load_settings(None, {"server": {"allow_credentials": True}})
    # the command line stops before loading anything, with one line
    result = subprocess.run(
        [sys.executable, "-m", "ninfer_serve", str(tmp_path / "none.ninfer"),
         "--allowed-origins", "*", "--allow-credentials"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "allow_credentials cannot go with allowed_origins '*'" in lines[0]
