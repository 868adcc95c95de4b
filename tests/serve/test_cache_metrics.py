"""Prefix-cache hits reach /metrics: the cached prompt tokens a reply reports are the ones the
counters add, and they are left out of the computed (prefill) tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import Server, metric, start_server

COUNTERS = (
    "ninfer_prompt_tokens_total",
    "ninfer_prompt_tokens_cached_total",
    "ninfer_prefill_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_cached_total",
)


@pytest.fixture(scope="module")
def server(artifact: Path) -> Iterator[Server]:
    yield from start_server(artifact, "--max-context", "2048")


def _counters(url: str) -> dict[str, float]:
    return {name: metric(url, name) for name in COUNTERS}


def _by_source(url: str, source: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("vllm:prompt_tokens_by_source_total{") and f'source="{source}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(source)


def _chat(server: Server, messages: list[dict[str, str]]) -> dict:
    body = {"model": server.model, "messages": messages, "max_tokens": 4, "temperature": 0}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_cached_prompt_tokens_are_counted_as_the_reply_reports(server: Server) -> None:
    before = _counters(server.url)
    computed_before = _by_source(server.url, "local_compute")
    hit_before = _by_source(server.url, "local_cache_hit")
    # the second turn resends the first (a long prefix) and adds to it
    first_turn = [{"role": "user", "content": "Tell me about the weather. " * 40}]
    first = _chat(server, first_turn)
    answer = first["choices"][0]["message"]["content"] or "x"
    second_turn = [
        *first_turn,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And tomorrow?"},
    ]
    second = _chat(server, second_turn)
    prompts = [r["usage"]["prompt_tokens"] for r in (first, second)]
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (first, second)]
    assert cached[0] == 0 and cached[1] > 100  # the shared prefix was resumed

    after = _counters(server.url)
    gained = {name: after[name] - before[name] for name in COUNTERS}
    assert gained["ninfer_prompt_tokens_total"] == sum(prompts)
    assert gained["vllm:prompt_tokens_total"] == sum(prompts)
    assert gained["vllm:prefix_cache_queries_total"] == sum(prompts)
    for name in (
        "ninfer_prompt_tokens_cached_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_cached_total",
    ):
        assert gained[name] == sum(cached), name
    assert gained["ninfer_prefill_tokens_total"] == sum(prompts) - sum(cached)
    assert _by_source(server.url, "local_cache_hit") - hit_before == sum(cached)
    assert _by_source(server.url, "local_compute") - computed_before == sum(prompts) - sum(cached)
