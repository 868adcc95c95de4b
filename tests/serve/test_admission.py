"""Admission and lifecycle: capacity, 429 / 503 (Anthropic 529 / 504), disconnects free lanes.

The server runs one lane and one pending slot with a short pending timeout, so the outcome of
a burst is exact: one request runs, one waits and times out, the rest are refused at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from .conftest import Server, metric, start_server, wait_for

LONG = {
    "messages": [{"role": "user", "content": "Tell me a joke."}],
    "max_tokens": 6000,
    "ignore_eos": True,
    "stream": True,
}
SHORT = {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(
        artifact,
        "--max-concurrency", "1",
        "--max-pending-requests", "1",
        "--pending-timeout-ms", "800",
        "--max-context", "4096",
    )  # fmt: skip


class Long:
    """A long streamed request holding the only lane until closed."""

    def __init__(self, url: str):
        self.client = httpx.Client(timeout=30)
        self._cm = self.client.stream("POST", url + "/v1/chat/completions", json=LONG)
        self.response = self._cm.__enter__()
        self.lines = self.response.iter_lines()  # kept: dropping it would close the stream
        for line in self.lines:  # the first generated text: the lane is taken
            if '"content":"' in line and '"content":""' not in line:
                break

    def close(self) -> None:
        self._cm.__exit__(None, None, None)
        self.client.close()


def idle(url: str) -> bool:
    return (
        metric(url, "ninfer_requests_running") == 0
        and metric(url, "ninfer_requests_waiting") == 0
        and metric(url, "ninfer_lanes_in_use") == 0
    )


def burst(url: str, path: str, body: dict, count: int) -> list[httpx.Response]:
    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(httpx.post, url + path, json=body, timeout=30)
                   for _ in range(count)]  # fmt: skip
        return [f.result() for f in futures]


def test_burst_gives_exact_429_and_503_then_recovers(server):
    long = Long(server.url)
    try:
        assert long.response.status_code == 200
        started = time.monotonic()
        responses = burst(server.url, "/v1/chat/completions", SHORT, 5)
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [429, 429, 429, 429, 503]
        assert time.monotonic() - started >= 0.7  # the waiting one waited for its deadline
        for r in responses:
            error = r.json()["error"]
            expected = "server_overloaded" if r.status_code == 429 else "request_queue_timeout"
            assert error["code"] == expected and error["message"]
            assert r.headers["x-request-id"] and r.headers["retry-after"]
    finally:
        long.close()
    assert wait_for(lambda: idle(server.url), timeout=5)
    assert httpx.get(f"{server.url}/health").status_code == 200
    ok = httpx.post(f"{server.url}/v1/chat/completions", json=SHORT, timeout=30)
    assert ok.status_code == 200
    assert metric(server.url, "ninfer_admission_rejections_total") >= 4


def test_anthropic_overload_is_529_and_queue_timeout_504(server):
    body = {"model": server.model, "max_tokens": 4, "messages": SHORT["messages"]}
    long = Long(server.url)  # admission is shared: an OpenAI request holds the lane
    try:
        responses = burst(server.url, "/v1/messages", body, 3)
    finally:
        long.close()
    assert sorted(r.status_code for r in responses) == [504, 529, 529]
    for r in responses:
        payload = r.json()
        kind = "overloaded_error" if r.status_code == 529 else "timeout_error"
        assert payload["type"] == "error" and payload["error"]["type"] == kind
        assert payload["request_id"] == r.headers["request-id"]
    assert wait_for(lambda: idle(server.url), timeout=5)


def test_disconnect_mid_stream_frees_the_lane(server):
    cancelled = (
        metric(server.url, 'ninfer_requests_total{outcome="cancelled"}')
        if ("cancelled" in httpx.get(f"{server.url}/metrics").text)
        else 0.0
    )
    long = Long(server.url)
    assert metric(server.url, "ninfer_lanes_in_use") == 1
    long.close()
    assert wait_for(lambda: idle(server.url), timeout=3)
    tokens = metric(server.url, "ninfer_generation_tokens_total")
    time.sleep(0.3)
    assert metric(server.url, "ninfer_generation_tokens_total") == tokens  # nothing generates
    text = httpx.get(f"{server.url}/metrics").text
    line = next(x for x in text.splitlines()
                if x.startswith('ninfer_requests_total{outcome="cancelled"}'))  # fmt: skip
    assert float(line.rsplit(" ", 1)[1]) == cancelled + 1


def test_disconnect_of_waiting_and_non_streaming_requests(server):
    long = Long(server.url)
    try:
        with pytest.raises(httpx.ReadTimeout):  # queued behind the long one, gives up early
            httpx.post(f"{server.url}/v1/chat/completions", json=SHORT, timeout=0.3)
        assert wait_for(lambda: metric(server.url, "ninfer_requests_waiting") == 0, timeout=0.4)
    finally:
        long.close()
    assert wait_for(lambda: idle(server.url), timeout=3)
    body = {**LONG, "stream": False}
    for _ in range(3):  # repeated: a cancellation racing a token must not be lost
        with pytest.raises(httpx.ReadTimeout):  # running, non-streaming, client gives up
            httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=0.4)
        assert wait_for(lambda: idle(server.url), timeout=2)
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}


def test_prefill_time_is_part_of_the_first_token_time(server):
    """``ninfer_request_prefill_seconds`` (the engine taking a request to its first token)
    counts each request once and is a part of its time to first token (from arrival)."""
    names = ("ninfer_request_prefill_seconds", "ninfer_time_to_first_token_seconds")

    def totals() -> dict[str, float]:
        return {f"{n}_{p}": metric(server.url, f"{n}_{p}") for n in names for p in ("count", "sum")}

    assert wait_for(lambda: idle(server.url), timeout=3)
    before = totals()
    for _ in range(2):
        assert httpx.post(f"{server.url}/v1/chat/completions", json=SHORT, timeout=30).is_success
    after = totals()
    gained = {k: after[k] - before[k] for k in after}
    assert gained["ninfer_request_prefill_seconds_count"] == 2
    assert gained["ninfer_time_to_first_token_seconds_count"] == 2
    prefill, ttft = (gained[f"{n}_sum"] for n in names)
    assert 0 < prefill <= ttft
