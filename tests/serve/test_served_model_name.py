"""The model name the server answers to: the file's name as the command line gives it, or
``--served-model-name``; the README's serving example works as written."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import httpx
import pytest

from ninfer_serve.config import load_settings

from .conftest import ROOT, Server


def _readme_request() -> dict:
    """The JSON body of the README's ``curl`` to the server."""
    readme = (ROOT / "README.md").read_text("utf-8")
    serving = readme.split("## Serving", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"-d '(\{.*?\})'", serving, re.S)
    assert match, "the README's Serving section has no curl -d '{...}'"
    return json.loads(match[1])


@pytest.fixture
def model_ninfer(artifact: Path, tmp_path: Path) -> Path:
    """The converted artifact (named ``tiny`` inside) copied to ``model.ninfer``."""
    copy = tmp_path / "model.ninfer"
    shutil.copy(artifact, copy)
    return copy


def _serve(model: Path, *args: str) -> Server:
    return Server(model, "--max-context", "512", "--max-concurrency", "1", *args)


def test_the_readme_example_is_answered(model_ninfer: Path) -> None:
    body = _readme_request()
    body["max_tokens"] = 4
    server = _serve(model_ninfer)
    try:
        assert server.model == body["model"] == "model"
        assert "loading" in server.log and "as model 'model'" in server.log
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == "model"
    finally:
        assert server.stop() == 0


def test_served_model_name_chooses_the_name(model_ninfer: Path) -> None:
    server = _serve(model_ninfer, "--served-model-name", "team/chat-1")
    try:
        assert server.model == "team/chat-1"
        listed = httpx.get(f"{server.url}/v1/models", timeout=10).json()
        assert [m["id"] for m in listed["data"]] == ["team/chat-1"]
        # as vLLM: the artifact served under that name, the context, no parent
        (model,) = listed["data"]
        assert model["root"] == str(model_ninfer) and model["parent"] is None
        assert model["max_model_len"] == 512 and model["owned_by"] == "ninfer"
        body = {"model": "model", "messages": [{"role": "user", "content": "Hi"}]}
        refused = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "model_not_found"
    finally:
        assert server.stop() == 0


def test_the_name_in_toml_and_its_older_spelling(tmp_path: Path) -> None:
    config = tmp_path / "ninfer.toml"
    config.write_text("[server]\nserved_model_name = 'qwen'\n")
    assert load_settings(config, {}).server.served_model_name == "qwen"
    config.write_text("[server]\nmodel_id = 'older'\n")
    assert load_settings(config, {}).server.served_model_name == "older"
    flags = {"server": {"served_model_name": "flag"}}
    assert load_settings(config, flags).server.served_model_name == "flag"
