"""Fixtures for the server tests: the bundled model converted once, real server processes.

Each test module starts its own ``python -m ninfer_serve`` on a free loopback port (``--port
0``; the URL is read from the "serving" line) with the limits it needs, and stops it with
SIGINT at the end, checking that Ctrl-C drains and exits with status 0.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.bundled import BUNDLED

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"serving '(?P<model>[^']+)' at (?P<url>http://\S+)/v1")


@pytest.fixture(scope="session")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ninfer_convert.pipeline import convert

    out = tmp_path_factory.mktemp("serve") / "tiny.ninfer"
    convert("qwen3_5_bf16", {"base": str(BUNDLED)}, out)
    return out


class Server:
    """A running ``ninfer-serve`` process; ``lines`` collects its stderr."""

    def __init__(self, artifact: Path, *args: str, ready: bool = True):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ninfer_serve", str(artifact), "--port", "0", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.url = ""
        self.model = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if ready:
            self.wait_ready()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            match = READY.search(line)
            if match:
                self.url, self.model = match["url"], match["model"]
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float = 60) -> None:
        if not self._ready.wait(timeout) or not self.url:
            self.process.kill()
            raise RuntimeError("server did not start:\n" + "\n".join(self.lines))

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def stop(self, timeout: float = 30) -> int:
        """SIGINT (Ctrl-C) and wait; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        self._reader.join(5)  # the last lines of the log, read to the end of the pipe
        return code


def start_server(artifact: Path, *args: str) -> Iterator[Server]:
    """Yield a ready server; on teardown check that Ctrl-C exits cleanly."""
    server = Server(artifact, *args)
    try:
        yield server
    finally:
        code = server.stop()
        assert code == 0, f"exit status {code}:\n{server.log}"
        assert "stopped" in server.log


def metric(url: str, name: str, headers: dict[str, str] | None = None) -> float:
    """One un-labelled (or first-labelled) sample from /metrics."""
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def generate_all(engine: Any, request: Any) -> tuple[list[int], Any, Any]:
    """Run one request in process: (token ids, the parsed reply, its ``Finished`` event)."""
    from ninfer_runtime.engine import Finished, OutputEvent, TokenEvent
    from ninfer_runtime.frontend import OutputAccumulator

    ids, parsed, finished = [], OutputAccumulator(), None
    for event in engine.generate(request):
        if isinstance(event, TokenEvent):
            ids.append(event.token_id)
        elif isinstance(event, OutputEvent):
            parsed.add([event.event])
        elif isinstance(event, Finished):
            finished = event
    return ids, parsed.result(), finished
