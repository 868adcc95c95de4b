"""Decode lanes: ``auto`` (the default) opens as many as the context pool holds, up to the
backend's most and ``AUTO_LANES`` (8); a pinned ``--max-concurrency`` is kept, up to the
backend's most (64 on the CPU); the start-up lines say which."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from ninfer_runtime.engine import Engine
from ninfer_runtime.lane_limits import backend_max_lanes
from ninfer_serve.config import ConfigError, load_settings
from ninfer_serve.lanes import AUTO_LANES, LANE_CONTEXT_TOKENS, choose_lanes, engine_lanes

from .conftest import Server, metric

CONTEXT = 2048
#: the most lanes the CPU backend runs
CPU_LANES = backend_max_lanes("cpu")


def _pool_sizes(artifact: Path, lanes: int) -> tuple[int, int, int]:
    """(bytes of the engine's lane slots, bytes of a page, pages of one auto lane's context)
    for ``artifact`` at ``CONTEXT`` tokens with ``lanes`` lanes."""
    engine = Engine(artifact, max_context=CONTEXT, max_lanes=lanes, prefix_cache=True)
    pool = engine.pool
    return pool.slots * pool.slot_bytes, pool.page_bytes, pool.pages_for(CONTEXT)


def test_auto_opens_what_the_pool_holds(artifact: Path) -> None:
    assert CPU_LANES == 64 and engine_lanes("auto", "cpu") == AUTO_LANES == 8
    for budget_lanes, built in ((3, AUTO_LANES), (5, AUTO_LANES), (12, 16)):
        slots, page, per_lane = _pool_sizes(artifact, built)
        budget = slots + budget_lanes * per_lane * page + page // 2
        engine = Engine(
            artifact,
            max_context=CONTEXT,
            max_lanes=built,  # 16: an engine built with more than auto's (past CUDA's 8)
            context_capacity=budget,
            prefix_cache=True,
        )
        choice = choose_lanes("auto", engine)
        assert choice.lanes == budget_lanes, choice
        assert f"{budget_lanes} lane(s) of {CONTEXT} tokens" in choice.reason
        assert choose_lanes(2, engine).lanes == 2  # pinned: as given
    # no device limit (the CPU): every lane gets its context, so the engine's most
    unlimited = Engine(artifact, max_context=CONTEXT, max_lanes=engine_lanes("auto", "cpu"))
    assert choose_lanes("auto", unlimited).lanes == AUTO_LANES
    assert min(CONTEXT, LANE_CONTEXT_TOKENS) == CONTEXT


def test_the_setting_is_auto_or_a_number(tmp_path: Path) -> None:
    assert load_settings(None, {}).engine.max_concurrency == "auto"
    assert load_settings(None, {"engine": {"max_concurrency": "3"}}).engine.max_concurrency == 3
    config = tmp_path / "ninfer.toml"
    config.write_text("[engine]\nmax_concurrency = 'auto'\n")
    assert load_settings(config, {}).engine.max_concurrency == "auto"
    assert load_settings(None, {"engine": {"max_concurrency": 64}}).engine.max_concurrency == 64
    for bad in ("0", "65", "many", "2.5"):
        with pytest.raises(ConfigError, match=r"max_concurrency: .*expected 'auto' or 1\.\.64"):
            load_settings(None, {"engine": {"max_concurrency": bad}})


def test_a_pinned_number_is_bounded_by_the_backend() -> None:
    """The CUDA backend's most lanes (64, known without CuPy): one more is refused naming the
    key, before anything loads; ``auto`` builds its engine with at most ``AUTO_LANES``."""
    most = backend_max_lanes("cuda")
    cuda = {"backend": "cuda", "max_concurrency": most}
    assert load_settings(None, {"engine": cuda}).engine.max_concurrency == most
    with pytest.raises(
        ConfigError, match=rf"max_concurrency: .*1\.\.{most} lanes \(the most the cuda"
    ):
        load_settings(None, {"engine": {**cuda, "max_concurrency": most + 1}})
    assert (
        engine_lanes("auto", "cuda") == min(most, AUTO_LANES) == 8 and engine_lanes(5, "cuda") == 5
    )


def _generation_span(server: Server) -> tuple[float, float]:
    """When a streamed generation's first and last tokens arrived (monotonic seconds)."""
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 150,
        "ignore_eos": True,
        "stream": True,
    }
    stamps = []
    url = f"{server.url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("content") or delta.get("reasoning_content"):
                    stamps.append(time.monotonic())
    assert stamps, "the stream ended without a token"
    return stamps[0], stamps[-1]


def test_the_server_starts_with_auto_lanes_that_run_together(artifact: Path) -> None:
    server = Server(artifact, "--max-context", str(CONTEXT))
    try:
        assert "lanes auto" in server.log  # the loading line
        assert f"{AUTO_LANES} decode lane(s) (auto:" in server.log
        assert metric(server.url, "ninfer_max_concurrency") == AUTO_LANES
        # two clients at once are decoded together: each one's tokens start before the
        # other's end (one lane would serve them one after the other)
        with ThreadPoolExecutor(2) as pool:
            spans = list(pool.map(lambda _: _generation_span(server), range(2)))
        assert max(first for first, _ in spans) < min(last for _, last in spans), spans
    finally:
        assert server.stop() == 0


def test_a_pinned_number_is_kept(artifact: Path) -> None:
    server = Server(artifact, "--max-context", str(CONTEXT), "--max-concurrency", "2")
    try:
        assert "2 lane(s)" in server.log and "2 decode lane(s) (--max-concurrency)" in server.log
        assert metric(server.url, "ninfer_max_concurrency") == 2
    finally:
        assert server.stop() == 0
