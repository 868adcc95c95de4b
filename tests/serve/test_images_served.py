"""Image input refused at the HTTP edge, through a real server (the bundled text model):
every bad image is one 400 naming the client's field, in each API's error shape, and the
server goes on serving. The images a VLM reads are in ``test_images_vlm.py``."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import Server, start_server

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(32)).decode()
DATA_URL = f"data:image/png;base64,{PNG}"


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(
        artifact, "--max-context", "256", "--max-images-per-request", "4", "--max-image-mib", "1"
    )


def chat(*parts: dict[str, Any]) -> dict[str, Any]:
    content = [{"type": "text", "text": "What is this?"}, *parts]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 2}


def image_url(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def anthropic(source: dict[str, Any]) -> dict[str, Any]:
    content = [{"type": "text", "text": "What is this?"}, {"type": "image", "source": source}]
    return {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}


FIELD = "messages[0].content[1].image_url.url"
BIG = base64.b64encode(bytes(1536 * 1024)).decode()  # 1.5 MiB: within the body, over the image

CASES = [
    ("/v1/chat/completions", chat(image_url("data:text/plain;base64,aGk=")), "invalid_image",
     FIELD),
    ("/v1/chat/completions", chat(image_url("data:image/png;base64,iVBO*RK")), "invalid_image",
     FIELD),
    ("/v1/chat/completions", chat(*[image_url(DATA_URL)] * 100), "too_many_images",
     "messages[0].content[5].image_url.url"),
    ("/v1/chat/completions", chat(image_url(f"data:image/png;base64,{BIG}")), "image_too_large",
     FIELD),
    ("/v1/chat/completions", chat(image_url("https://example.com/cat.png")),
     "image_url_not_allowed", FIELD),
    # a text-only model: the engine's one line, blamed on the conversation
    ("/v1/chat/completions", chat(image_url(DATA_URL)), None, "messages"),
    ("/v1/responses",
     {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
     "unsupported_parameter", "input[0].content[0].file_id"),
    ("/v1/responses",
     {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
     "invalid_image", "input[0].content[0].image_url"),
    ("/v1/messages", anthropic({"type": "base64", "media_type": "text/html", "data": PNG}),
     "invalid_request_error", None),
    ("/v1/messages", anthropic({"type": "base64", "media_type": "image/png", "data": "%%"}),
     "invalid_request_error", None),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "code", "param"), CASES)
def test_each_bad_image_is_one_400(server, path, body, code, param):
    response = httpx.post(f"{server.url}{path}", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if path == "/v1/messages":  # Anthropic's shape: a type and a message naming the field
        assert error["type"] == code and "messages[0].content[1].source." in error["message"]
    else:
        assert error["param"] == param, error
        assert code is None or error["code"] == code, error
    assert len(error["message"]) < 400 and "\n" not in error["message"]


def test_the_server_stays_live(server):
    for path, body, _, _ in CASES:
        httpx.post(f"{server.url}{path}", json=body, timeout=30)
    assert httpx.get(f"{server.url}/health", timeout=5).json() == {"status": "ok"}
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=chat(), timeout=60)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2
    assert "Traceback" not in server.log
