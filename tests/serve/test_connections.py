"""Connections that send nothing, trickle a request head or come beyond the limit are closed
or refused, and an overload is logged once, not once per connection."""

from __future__ import annotations

import os
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import Server, metric, start_server, wait_for

TIMEOUT = 0.5
LIMIT = 3
HEALTH = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"


def _connect(server: Server) -> socket.socket:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _timed_out(url: str, phase: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(f'ninfer_connections_timed_out_total{{phase="{phase}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(phase)


@pytest.fixture(scope="module")
def server(artifact: Path) -> Iterator[Server]:
    yield from start_server(
        artifact,
        "--max-concurrency", "1",
        "--keep-alive-timeout", str(TIMEOUT),
        "--header-timeout", str(TIMEOUT),
    )  # fmt: skip


def test_an_idle_keep_alive_connection_is_closed(server: Server) -> None:
    before = _timed_out(server.url, "idle")
    with _connect(server) as sock:
        sock.sendall(HEALTH)
        started = time.monotonic()
        reply = _read_until_closed(sock)  # the answer, then nothing until the close
        waited = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.1 200") and b'{"status":"ok"}' in reply
    assert TIMEOUT * 0.8 <= waited < TIMEOUT + 3, waited
    assert _timed_out(server.url, "idle") == before + 1


def test_a_slowloris_head_is_closed_after_the_header_timeout(server: Server) -> None:
    before = _timed_out(server.url, "header")
    with _connect(server) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        # a byte every 0.1 s keeps the connection busy but never finishes the head
        sock.settimeout(0.1)
        reply = b""
        for byte in b"X-Slow: " + b"a" * 100:
            try:
                sock.sendall(bytes([byte]))
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if not chunk:
                break
            reply += chunk
        waited = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert TIMEOUT * 0.8 <= waited < TIMEOUT + 3, waited
    assert _timed_out(server.url, "header") == before + 1


def test_a_connection_that_sends_nothing_is_closed(server: Server) -> None:
    with _connect(server) as sock:
        started = time.monotonic()
        assert _read_until_closed(sock) == b""
        assert time.monotonic() - started < TIMEOUT + 3


def test_beyond_the_limit_connections_get_503_and_one_log_line(artifact: Path) -> None:
    server = Server(artifact, "--max-concurrency", "1", "--max-connections", str(LIMIT))
    held = []
    try:
        held = [_connect(server) for _ in range(LIMIT)]
        for sock in held:  # each answered once, so each is served (and kept alive)
            sock.sendall(HEALTH)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        for _ in range(3):
            with _connect(server) as extra:
                extra.sendall(HEALTH)
                reply = _read_until_closed(extra)
            assert reply.startswith(b"HTTP/1.1 503"), reply
            assert b"too_many_connections" in reply and b"retry-after: 1" in reply

        def episodes() -> list[str]:
            return [line for line in server.lines if "connection limit reached" in line]

        # the log line reaches us through the server's stderr, possibly after the replies
        assert wait_for(lambda: episodes()), server.log
        time.sleep(0.3)  # a second line, if one were coming, would be here by now
        assert len(episodes()) == 1, server.log
        assert "Traceback" not in server.log
        for sock in held:
            sock.close()
        held = []
        # served again once connections close
        assert wait_for(lambda: httpx.get(f"{server.url}/health", timeout=5).status_code == 200)
        assert metric(server.url, "ninfer_connections_refused_total") == 3
    finally:
        for sock in held:
            sock.close()
        assert server.stop() == 0


def test_running_out_of_descriptors_is_logged_once(artifact: Path) -> None:
    server = Server(artifact, "--max-concurrency", "1", "--max-connections", "1000")
    clients = []
    try:
        pid = server.process.pid
        spare = 8
        in_use = len(os.listdir(f"/proc/{pid}/fd"))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + spare, in_use + spare))
        clients = [_connect(server) for _ in range(spare + 20)]  # the rest wait in the backlog
        for sock in clients:
            sock.sendall(HEALTH)
        time.sleep(1.5)  # accept() is retried a second later
        lines = [line for line in server.lines if "cannot accept connections" in line]
        assert len(lines) == 1, server.log
        assert "Too many open files" in lines[0]
        assert "Traceback" not in server.log and "out of system resource" not in server.log
        for sock in clients:
            sock.close()
        clients = []
        assert wait_for(lambda: httpx.get(f"{server.url}/health", timeout=5).status_code == 200)
    finally:
        for sock in clients:
            sock.close()
        assert server.stop() == 0
