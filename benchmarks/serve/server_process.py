"""The ``ninfer-serve`` subprocess a level or mode runs against: its command line and flags,
starting it on a free port until it answers ready, and stopping it."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import TextIO

import httpx

from . import ROOT
from .errors import BenchError

#: the server's context pool on a GPU unless --context-capacity says otherwise: a 27B-class
#: model's 8 lanes x 1024 tokens take about 2.3 GiB (1 GiB of K/V, 1.3 GiB of recurrent
#: states) and prefix-cache snapshots the rest, while a fixed size keeps the run from
#: depending on what else holds the card ("auto" would take all of it)
CUDA_CONTEXT_CAPACITY = "16GiB"


def server_command(
    model: Path, concurrency: int, max_context: int, cpus: str | None, extra: list[str] = ()
) -> list[str]:
    """``python -m ninfer_serve`` with this interpreter (works without the ``ninfer-serve``
    script, e.g. with the project on PYTHONPATH), its lanes given explicitly."""
    command = [
        sys.executable,
        "-m",
        "ninfer_serve",
        str(model),
        "--port",
        "0",
        "--max-concurrency",
        str(concurrency),
        "--max-context",
        str(max_context),
        "--max-pending-requests",
        "1024",
        "--log-level",
        "warning",
        *extra,
    ]
    if cpus:
        command = ["taskset", "-c", cpus, *command]  # comma-separated CPU numbers
    return command


#: the server's address in its start-up lines ("loading ...; URL/health answers 503 until
#: ready", "serving 'model' at URL/v1 ...")
SERVER_URL = re.compile(r"(http://[^\s/]+)/(?:v1|health)\b")


def start_server(
    model: Path,
    concurrency: int,
    max_context: int,
    cpus: str | None,
    extra: list[str] = (),
    timeout: float = 1800,
) -> tuple[subprocess.Popen[str], str, str]:
    """A server on a free port, once ``/health`` says ready: (process, URL, the model id
    ``/v1/models`` lists)."""
    command = server_command(model, concurrency, max_context, cpus, extra)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    seen: deque[str] = deque(maxlen=20)
    url = None
    for line in process.stderr:
        seen.append(line)
        if match := SERVER_URL.search(line):
            url = match[1]
            break
    try:
        if url is None:
            raise BenchError("the server did not start; its last lines:\n" + "".join(seen))
        # keep reading its log: a full pipe would block the server at its next message
        threading.Thread(target=echo_errors, args=(process.stderr,), daemon=True).start()
        wait_ready(process, url, timeout)
        models = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
        return process, url, models[0]["id"]
    except BaseException:
        stop_server(process)
        raise


def wait_ready(process: subprocess.Popen[str], url: str, timeout: float) -> None:
    """Until ``/health`` answers 200 (the model loaded), or a clear error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(f"the server exited with status {process.returncode} while loading")
        try:
            if httpx.get(f"{url}/health", timeout=10).status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        time.sleep(0.2)
    raise BenchError(f"the server at {url} was not ready after {timeout:.0f} s")


def echo_errors(log: TextIO) -> None:
    """The server's log after start-up, shown (it runs at level warning: nothing to hide)."""
    for line in log:
        sys.stderr.write(f"[server] {line}")


def stop_server(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)


def server_args(args: argparse.Namespace, cache: bool = True) -> list[str]:
    """``--backend``, ``--context-capacity`` (on a GPU ``CUDA_CONTEXT_CAPACITY`` unless
    given) and ``--server-args`` (last: its flags win), plus a config turning the prefix cache
    off when ``cache`` is false."""
    extra = ["--backend", args.backend]
    capacity = args.context_capacity or (CUDA_CONTEXT_CAPACITY if args.backend == "cuda" else None)
    if capacity:
        extra += ["--context-capacity", capacity]
    extra += shlex.split(args.server_args or "")
    if not cache:
        config = Path(tempfile.mkdtemp(prefix="serve-bench-")) / "cache-off.toml"
        config.write_text("[context_cache]\nenabled = false\n")
        extra += ["--config", str(config)]
    return extra
