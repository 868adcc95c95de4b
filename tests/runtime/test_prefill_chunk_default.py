"""The prefill chunk when none is given: the backend's own (the CPU 512, CUDA 2048), known
before a backend exists, for ``Engine`` and for the server's unset ``[engine] prefill_chunk``;
a given chunk stays."""

from __future__ import annotations

import pytest

from ninfer_runtime.engine import Engine
from ninfer_runtime.errors import EngineError
from ninfer_runtime.prefill_reads import PREFILL_CHUNK, default_prefill_chunk
from ninfer_serve.config import ConfigError, load_settings


def test_each_backend_states_its_chunk_known_without_creating_it():
    assert default_prefill_chunk("cpu") == 512
    assert default_prefill_chunk("cuda") == 2048  # the traits class: no CuPy needed

    class Stated:  # a backend instance that states none
        pass

    assert default_prefill_chunk(Stated()) == PREFILL_CHUNK


def test_the_engine_takes_the_backends_chunk_unless_given_one(artifact_path):
    path = artifact_path("tiny_q4", "dense")
    assert Engine(path, max_context=64, max_lanes=1).prefill_chunk == 512
    given = Engine(path, max_context=64, max_lanes=1, prefill_chunk=24)
    assert given.prefill_chunk == given.scheduler.prefill_chunk == 24
    with pytest.raises(EngineError, match="prefill_chunk"):
        Engine(path, max_context=64, max_lanes=1, prefill_chunk=0)


def test_the_servers_unset_chunk_reaches_the_engine_as_the_backends(tmp_path):
    assert load_settings(None, {}).engine.prefill_chunk is None
    config = tmp_path / "ninfer.toml"
    config.write_text("[engine]\nprefill_chunk = 4096\n")
    assert load_settings(config, {}).engine.prefill_chunk == 4096
    config.write_text("[engine]\nprefill_chunk = 0\n")
    with pytest.raises(ConfigError, match="prefill_chunk"):
        load_settings(config, {})
