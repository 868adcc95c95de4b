"""A real Prometheus scrapes a live ``ninfer-serve`` and answers queries for its series.

Needs the ``prometheus`` binary (Debian's ``prometheus`` package; ``.ci/run`` installs it);
skipped with that reason where it is absent. Prometheus scrapes every second with the API key,
and the test reads ninfer series back through the HTTP query API.

Prometheus 2.x (Debian 12 ships 2.42) falls back to the text parser when it cannot parse the
Content-Type, so it scraped even the old duplicated-charset header; Prometheus 3 fails such a
scrape. The exact header is checked in ``test_transport_defects``; this test proves the series
read back end to end.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import Server, start_server

PROMETHEUS = shutil.which("prometheus") or (
    "/usr/bin/prometheus" if Path("/usr/bin/prometheus").is_file() else None
)
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="prometheus is not installed (apt-get install prometheus; .ci/run installs it)",
)
KEY = "sk-scrape-1"


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(artifact, "--api-key", KEY, "--max-context", "512")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def prometheus(server, tmp_path) -> Iterator[str]:
    target = server.url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n"
        "  - job_name: ninfer\n"
        "    authorization:\n"
        f"      credentials: {KEY}\n"
        "    static_configs:\n"
        f"      - targets: ['{target}']\n"
    )
    port = free_port()
    assert PROMETHEUS is not None
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def query(prometheus: str, expression: str) -> list[dict]:
    try:
        response = httpx.get(f"{prometheus}/api/v1/query", params={"query": expression}, timeout=2)
    except httpx.TransportError:  # still starting
        return []
    if response.status_code != 200:
        return []
    return response.json()["data"]["result"]


def eventually(prometheus: str, expression: str, timeout: float = 15) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = query(prometheus, expression)
        if result:
            return result
        time.sleep(0.25)
    targets = httpx.get(f"{prometheus}/api/v1/targets", timeout=2).json()
    raise AssertionError(f"no result for {expression!r}; targets: {targets}")


def test_prometheus_scrapes_ninfer_series(server, prometheus):
    auth = {"Authorization": f"Bearer {KEY}"}
    chat = {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 3}
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=chat, headers=auth, timeout=30)
    assert answer.status_code == 200
    (info,) = eventually(prometheus, 'ninfer_model_info{job="ninfer"}')
    assert info["metric"]["model_id"] == server.model and info["value"][1] == "1"
    (done,) = eventually(prometheus, 'ninfer_requests_total{outcome="completed"} >= 1')
    assert float(done["value"][1]) >= 1
    (ready,) = eventually(prometheus, "vllm:num_requests_running")
    assert ready["metric"]["model_name"] == server.model
    targets = httpx.get(f"{prometheus}/api/v1/targets", timeout=2).json()["data"]
    (target,) = targets["activeTargets"]
    assert target["health"] == "up" and target["lastError"] == "", target
