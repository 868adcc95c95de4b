"""A request that holds a server lane while the engine waits for context-pool pages.

Two lanes, and a context pool of three pages: both long requests start (a lane's pages grow
as it generates), and when the first needs another page the second is preempted: it keeps
its server lane yet waits inside the engine. vLLM's gauges must show it as waiting (the
engine runs one request), the server's own lane gauge as running.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from ninfer_runtime.engine import SHORT_CHUNK_TOKENS
from ninfer_runtime.models import load_model
from ninfer_runtime.state import PAGE_TOKENS, ContextPool

from .conftest import Server, metric, start_server, wait_for
from .test_admission import LONG, Long, idle

LANES = 2
CONTEXT = 4096


def three_pages_of_capacity(artifact) -> int:
    """Bytes of a pool with LANES slots and three pages."""
    specs, mtp = load_model(artifact).state_specs()
    page = ContextPool.page_bytes_of(specs, mtp, PAGE_TOKENS, "float32")
    return LANES * ContextPool.slot_bytes_of(specs, step_rows=SHORT_CHUNK_TOKENS) + 3 * page


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(
        artifact,
        "--max-concurrency", str(LANES),
        "--context-capacity", str(three_pages_of_capacity(artifact)),
        "--max-context", str(CONTEXT),
    )  # fmt: skip


def test_waiting_for_pages_counts_as_waiting(server, artifact):
    first = Long(server.url)
    second = None
    try:
        assert metric(server.url, "vllm:num_requests_running") == 1
        # the second holds the other server lane but no pages: it produces nothing yet
        second_client = httpx.Client(timeout=30)
        cm = second_client.stream("POST", server.url + "/v1/chat/completions", json=LONG)
        second = (second_client, cm, cm.__enter__())

        def queued() -> bool:
            return (
                metric(server.url, "ninfer_requests_running") == 2
                and metric(server.url, "vllm:num_requests_running") == 1
                and metric(server.url, "vllm:num_requests_waiting") == 1
            )

        assert wait_for(queued, timeout=30)  # once the first fills its first page
        assert metric(server.url, "ninfer_lanes_in_use") == 1
        assert metric(server.url, "ninfer_preemptions_total") >= 1
        # the page uses (K/V of running requests, cached K/V, free, snapshots) add up to
        # the pool's three pages
        text = httpx.get(server.url + "/metrics", timeout=10).text
        uses = {
            line.split('use="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("ninfer_context_pool_bytes{")
        }
        specs, mtp = load_model(artifact).state_specs()
        page = ContextPool.page_bytes_of(specs, mtp, PAGE_TOKENS, "float32")
        pages = ("kv_running", "kv_cached", "kv_free", "snapshots")
        assert sum(uses[use] for use in pages) == 3 * page
        assert uses["kv_running"] > 0
    finally:
        first.close()
        if second is not None:
            client, cm, _ = second
            cm.__exit__(None, None, None)
            client.close()
    assert wait_for(lambda: idle(server.url), timeout=5)
    assert metric(server.url, "vllm:num_requests_running") == 0
    assert metric(server.url, "vllm:num_requests_waiting") == 0
