"""Images with speculative decoding through the server: on a tiny random Qwen3.5 VLM with MTP
tensors (built as the engine test ``tests/runtime/test_engine_images_spec.py`` builds it), an
image request's greedy tokens from ``ninfer-serve --spec mtp`` equal those of a server without
``--spec``, and the speculating server did draft for it."""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.runtime.test_engine_images import CAT, checkpoint
from tests.runtime.test_engine_images_spec import add_vlm_mtp

from .conftest import Server, metric, start_server

__all__ = ["checkpoint"]  # the module fixture the artifact is built from


@pytest.fixture(scope="module")
def torch_threads() -> Any:
    """What ``checkpoint`` asks for (the runtime tests' session fixture, not seen here)."""
    import torch

    torch.set_num_threads(2)
    return torch


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Path:
    from ninfer_convert.pipeline import convert

    directory = tmp_path_factory.mktemp("served_vlm_mtp")
    shutil.copytree(checkpoint, directory, dirs_exist_ok=True)
    add_vlm_mtp(directory)
    path = directory / "vlm_mtp.ninfer"
    convert("qwen3_5_bf16", {"base": str(directory)}, path)
    return path


SERVING = ("--max-context", "256", "--max-concurrency", "1")


@pytest.fixture(scope="module")
def plain(artifact: Path) -> Iterator[Server]:
    yield from start_server(artifact, *SERVING)


@pytest.fixture(scope="module")
def speculating(artifact: Path) -> Iterator[Server]:
    yield from start_server(artifact, *SERVING, "--spec", "mtp", "--draft-tokens", "2")


def greedy_tokens(server: Server) -> tuple[list[bytes], dict[str, Any]]:
    """Each generated token's bytes and the message of a greedy image request."""
    url = "data:image/png;base64," + base64.b64encode(CAT).decode()
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": 10,
        "ignore_eos": True,
        "logprobs": True,
    }
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    return [bytes(t["bytes"]) for t in choice["logprobs"]["content"]], choice["message"]


def test_an_image_request_gives_the_same_greedy_tokens(plain: Server, speculating: Server):
    rounds = metric(speculating.url, "ninfer_spec_decode_rounds_total")
    tokens, message = greedy_tokens(speculating)
    expected, expected_message = greedy_tokens(plain)
    assert len(expected) == 10
    assert tokens == expected
    assert message == expected_message
    assert metric(speculating.url, "ninfer_spec_decode_rounds_total") > rounds
    assert metric(plain.url, "ninfer_spec_decode_rounds_total") == 0
