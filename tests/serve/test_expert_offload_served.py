"""``--vram-budget`` on the server: read from a flag, ``[engine] vram_budget`` or
``$NINFER_VRAM_BUDGET_MIB``; the start-up line says where the experts went, and /metrics
counts routed pairs computed on the device and on the host."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from ninfer_runtime.expert_offload import ExpertCounters
from ninfer_serve.config import ConfigError, load_settings
from ninfer_serve.engine_readings import CounterGains
from ninfer_serve.metrics import Metrics
from tests.serve.conftest import metric, start_server, wait_for


def test_the_budget_is_read_from_the_config_and_a_bad_size_named(tmp_path) -> None:
    config = tmp_path / "ninfer.toml"
    config.write_text("[engine]\nvram_budget = '8GiB'\n")
    assert load_settings(config, {}).engine.vram_budget == "8GiB"
    assert load_settings(None, {}).engine.vram_budget is None
    flags = {"engine": {"vram_budget": "512MiB"}}
    assert load_settings(config, flags).engine.vram_budget == "512MiB"
    config.write_text("[engine]\nvram_budget = 'lots'\n")
    with pytest.raises(ConfigError, match="vram budget 'lots': expected a size"):
        load_settings(config, {})
    config.write_text("[engine]\nvram_budget = '8GiB'\nhost_expert_cache = '2GiB'\n")
    assert load_settings(config, {}).engine.host_expert_cache == "2GiB"
    config.write_text("[engine]\nhost_expert_cache = 'some'\n")
    with pytest.raises(ConfigError, match="host expert cache 'some': expected a size"):
        load_settings(config, {})
    config.write_text("[engine]\nexpert_stream_rows = 64\n")
    assert load_settings(config, {}).engine.expert_stream_rows == 64
    assert load_settings(None, {}).engine.expert_stream_rows is None  # STREAM_ROWS
    config.write_text("[engine]\nexpert_stream_chunk = 4096\n")
    assert load_settings(config, {}).engine.expert_stream_chunk == 4096
    flags = {"engine": {"expert_stream_chunk": 16384}}
    assert load_settings(config, flags).engine.expert_stream_chunk == 16384
    assert load_settings(None, {}).engine.expert_stream_chunk is None  # STREAM_CHUNK
    config.write_text("[engine]\nexpert_stream_chunk = 0\n")
    with pytest.raises(ConfigError, match="expert_stream_chunk"):
        load_settings(config, {})
    config.write_text("[engine]\nexpert_stream_decode = 'all'\n")
    assert load_settings(config, {}).engine.expert_stream_decode == "all"
    flags = {"engine": {"expert_stream_decode": "off"}}
    assert load_settings(config, flags).engine.expert_stream_decode == "off"
    assert load_settings(None, {}).engine.expert_stream_decode is None  # auto
    from typing import get_args

    from ninfer_runtime.expert_offload.stream_window import STREAM_DECODE
    from ninfer_serve.config.engine import EngineSettings

    field = EngineSettings.model_fields["expert_stream_decode"].annotation
    assert get_args(get_args(field)[0]) == STREAM_DECODE  # the server's choices are the engine's
    config.write_text("[engine]\nexpert_stream_decode = 'sometimes'\n")
    with pytest.raises(ConfigError, match="expert_stream_decode"):
        load_settings(config, {})


def test_expert_counters_reach_the_metrics_as_increments() -> None:
    counters = ExpertCounters({0: 4})
    engine = SimpleNamespace(
        cache=None,
        preemptions=0,
        replayed_tokens=0,
        expert_offload=SimpleNamespace(counters=counters),
    )
    gains = CounterGains()
    counters.device_hits[0][:] = [3, 0, 1, 0]
    counters.host_hits[0][:] = [0, 2, 0, 0]
    counters.host_wait_seconds = 0.25
    counters.host_bytes = 3 << 20
    gained = gains.memory(engine)
    assert gained == {
        "expert_device_hits": 4,
        "expert_host_hits": 2,
        "expert_host_wait_seconds": 0.25,
        "expert_host_bytes": 3 << 20,
    }
    counters.host_hits[0][3] += 5
    assert gains.memory(engine) == {"expert_host_hits": 5}
    # pairs read in place, counted on the "device" (numpy here), with their link bytes
    on_device = counters.on_device(0, np, np.array([0, 100, 0, 100]))
    on_device[[1, 3]] += [2, 1]
    assert gains.memory(engine) == {"expert_device_hits": 3, "expert_mapped_bytes": 300}
    assert not on_device.any()  # drained
    metrics = Metrics("m", backend="cpu", max_concurrency=1, max_context=64)
    metrics.memory(gained)
    page = metrics.render().decode()
    assert "ninfer_expert_device_hits_total 4.0" in page
    assert "ninfer_expert_host_wait_seconds_total 0.25" in page
    assert "ninfer_expert_host_bytes_total 3.145728e+06" in page
    assert "ninfer_expert_streamed_bytes_total 0.0" in page


@pytest.fixture(scope="module")
def moe_artifact(tmp_path_factory: pytest.TempPathFactory):
    from ninfer_convert.pipeline import convert
    from tests.tiny_checkpoints import build

    root = tmp_path_factory.mktemp("offload")
    out = root / "moe.ninfer"
    convert("tiny_q4", {"base": str(build(root / "moe", moe=True))}, out)
    return out


BUDGET = ("--vram-budget", "1.6MiB", "--context-capacity", "1MiB", "--max-concurrency", "1")


def say_hello(server) -> None:
    """A short greedy chat, answered."""
    reply = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={
            "model": server.model,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 4,
            "temperature": 0,
        },
        timeout=60,
    )
    assert reply.status_code == 200, reply.text


def test_a_served_moe_model_splits_its_experts(moe_artifact) -> None:
    """About half the experts fit (other weights 556 KiB + an 866 KiB pool, then 408 KiB of
    experts): both sides compute pairs, and /metrics counts them."""
    for server in start_server(moe_artifact, *BUDGET):
        # log records pass through the app's logging queue: the plan's line may follow the
        # ready line by a moment
        wait_for(lambda server=server: "routed experts in device memory" in server.log)
        assert "8 of 16 routed experts in device memory" in server.log, server.log
        say_hello(server)
        assert metric(server.url, "ninfer_expert_device_hits_total") > 0
        assert metric(server.url, "ninfer_expert_host_hits_total") > 0, server.log


def test_a_served_moe_model_reads_its_host_experts_in_place(moe_artifact) -> None:
    """``--expert-stream-decode mapped``: the host computes no pair, and /metrics counts the
    pairs the device read in place and the bytes it read so."""
    for server in start_server(moe_artifact, *BUDGET, "--expert-stream-decode", "mapped"):
        say_hello(server)
        assert metric(server.url, "ninfer_expert_device_hits_total") > 0
        assert metric(server.url, "ninfer_expert_mapped_bytes_total") > 0, server.log
        assert metric(server.url, "ninfer_expert_host_hits_total") == 0
