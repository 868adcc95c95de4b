"""Speculative decoding in the server: the ``[speculative]`` table and its flags, the spec
counters under our names and vLLM's, and the accepted / rejected drafts in the usage.

The bundled model's MTP head is random, so few drafts are accepted; the counts are exact
anyway: every drafted token is either accepted or rejected in some request's usage.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ninfer_runtime.speculative import SpecConfig
from ninfer_serve.config import ConfigError, load_settings

from .conftest import Server, start_server

K = 2
QUESTION = [{"role": "user", "content": "What is the capital of Italy?"}]


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(
        artifact, "--spec", "mtp", "--draft-tokens", str(K), "--max-concurrency", "2"
    )


def samples(url: str) -> dict[tuple[str, str | None], float]:
    """/metrics as {(series, position label or None): value}."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (s.name, s.labels.get("position")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def gained(before: dict, after: dict) -> dict[tuple[str, str | None], float]:
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def chat(url: str, model: str, **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": QUESTION, "temperature": 0, **extra}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def streamed_usage(url: str, model: str) -> dict[str, Any]:
    body = {"model": model, "messages": QUESTION, "temperature": 0, "max_tokens": 7,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: {")]  # fmt: skip
    (usage,) = [e["usage"] for e in events if e.get("usage")]
    return usage


def drafts_of(details: dict[str, Any]) -> tuple[int, int]:
    return details["accepted_prediction_tokens"], details["rejected_prediction_tokens"]


def test_counters_and_usage_count_every_draft(server):
    """Concurrent greedy requests (plain, streamed, Responses): each usage splits its drafts
    into accepted and rejected, and the counters hold exactly their sum, under both names."""
    before = samples(server.url)
    with ThreadPoolExecutor(3) as pool:
        plain = pool.submit(chat, server.url, server.model)
        stream = pool.submit(streamed_usage, server.url, server.model)
        body = {"model": server.model, "input": "Hello!", "max_output_tokens": 9}
        responses = pool.submit(httpx.post, f"{server.url}/v1/responses", json=body, timeout=60)
        reply, stream_usage, answer = plain.result(), stream.result(), responses.result().json()
    assert reply["choices"][0]["message"]["content"] == "The capital of Italy is Rome."
    usages = [
        drafts_of(reply["usage"]["completion_tokens_details"]),
        drafts_of(stream_usage["completion_tokens_details"]),
        drafts_of(answer["usage"]["output_tokens_details"]),
    ]
    assert reply["usage"]["completion_tokens_details"]["reasoning_tokens"] >= 0
    m = gained(before, samples(server.url))
    rounds = m[("ninfer_spec_decode_rounds_total", None)]
    drafted = m[("ninfer_spec_decode_draft_tokens_total", None)]
    accepted = m[("ninfer_spec_decode_accepted_tokens_total", None)]
    assert m[("vllm:spec_decode_num_draft_tokens_total", None)] == drafted > 0
    assert drafted == rounds * K
    assert sum(a + r for a, r in usages) == drafted
    assert sum(a for a, _ in usages) == accepted
    assert m[("vllm:spec_decode_num_drafts_total", None)] == rounds
    assert m[("vllm:spec_decode_num_accepted_tokens_total", None)] == accepted
    assert m[("ninfer_spec_decode_fallback_steps_total", None)] == 0
    ours = [m[("ninfer_spec_decode_accepted_per_position_total", str(j))] for j in range(K)]
    theirs = [m[("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(j))] for j in range(K)]
    assert ours == theirs and sum(ours) == accepted
    assert ours == sorted(ours, reverse=True), "a later draft is only kept after the earlier"


def test_speculative_table(tmp_path):
    config = tmp_path / "ninfer.toml"
    config.write_text("[speculative]\nmethod = 'mtp'\n")
    assert load_settings(config, {}).speculative.spec_config() == SpecConfig("mtp", 3)
    config.write_text("[speculative]\nmethod = 'mtp'\ndraft_tokens = 5\nproposal_head = 'full'\n")
    assert load_settings(config, {}).speculative.spec_config() == SpecConfig("mtp", 5, "full")
    flags = {"speculative": {"draft_tokens": 1}}
    assert load_settings(config, flags).speculative.spec_config() == SpecConfig("mtp", 1, "full")
    assert load_settings(None, {}).speculative.spec_config() is None
    refused = {
        "method = 'dflash'": "speculative method 'dflash' is not available yet",
        "method = 'dflash2'\ndraft_tokens = 8": "'dflash2' is not available yet",
        "method = 'medusa'": "speculative method 'medusa': expected 'mtp' or 'off'",
        "method = 'mtp'\ndraft_tokens = 6": "draft_tokens 6: mtp drafts 1..5",
        "method = 'mtp'\nproposal_head = 'half'": "proposal_head 'half'",
        "draft_tokens = 2": "draft_tokens needs method 'mtp'",
        "methd = 'mtp'": "unknown key 'speculative.methd'",
    }
    for table, message in refused.items():
        config.write_text(f"[speculative]\n{table}\n")
        with pytest.raises(ConfigError, match=f"^{config}: .*{message}") as error:
            load_settings(config, {})
        assert "\n" not in str(error.value)


def test_constrained_requests_fall_back_to_plain_steps(server):
    """A grammar decides a constrained request's next token, so its lane keeps one token a
    round without drafts: counted as fallback steps, no drafts in its usage."""
    before = samples(server.url)
    reply = chat(server.url, server.model, max_tokens=6, response_format={"type": "json_object"})
    m = gained(before, samples(server.url))
    assert drafts_of(reply["usage"]["completion_tokens_details"]) == (0, 0)
    assert m[("ninfer_spec_decode_fallback_steps_total", None)] == pytest.approx(
        reply["usage"]["completion_tokens"] - 1
    )
    assert m[("ninfer_spec_decode_rounds_total", None)] == 0
