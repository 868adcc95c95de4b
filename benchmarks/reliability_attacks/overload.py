"""The ``overload`` family: concurrent chat, responses and messages requests (some abandoned by
the client) against the live server with one lane and two queue places, then one large prompt.

A failure is a 5xx other than 503/504/529, a hang, ``/health`` not answering within 1 s, or
``ninfer_requests_total`` not counting every request.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .bookkeeping import Budget, Tally, short
from .live_server import ALLOWED_5XX, LiveServer

PROMPT = "tell me a joke about the weather in paris"
#: Concurrent clients of the storm: many times the server's one lane and two queue places.
CLIENTS = 12
#: A storm request unanswered this long hangs: an answer takes under a second, a queued
#: request is refused after the server's 1 s pending timeout.
HANG_SECONDS = 10.0


def _storm_request(rng: random.Random, model: str) -> tuple[str, dict[str, Any]]:
    stream = rng.random() < 0.5
    tokens = rng.choice([8, 32, 128])
    text = f"{PROMPT} {rng.randrange(10**6)}"
    kind = rng.choice(["chat", "responses", "messages"])
    if kind == "chat":
        return "/v1/chat/completions", {
            "model": model, "stream": stream, "max_tokens": tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": text}],
        }  # fmt: skip
    if kind == "responses":
        body = {"model": model, "stream": stream, "max_output_tokens": tokens, "input": text}
        return "/v1/responses", body
    return "/v1/messages", {
        "model": model, "stream": stream, "max_tokens": tokens,
        "messages": [{"role": "user", "content": text}],
    }  # fmt: skip


def _total_requests(url: str) -> float:
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ninfer_requests_total{")
    )


#: GET /health every 0.2 s with a 1 s timeout, one "status seconds" line per probe. A process
#: of its own, so the storm's client threads cannot delay it (they hold this process's GIL).
PROBE = """
import http.client, sys, time
host, port = sys.argv[1], int(sys.argv[2])
while True:
    started = time.monotonic()
    try:
        connection = http.client.HTTPConnection(host, port, timeout=1.0)
        connection.request("GET", "/health")
        status = connection.getresponse().status
        connection.close()
    except OSError as exc:
        status = type(exc).__name__
    print(status, round(time.monotonic() - started, 3), flush=True)
    time.sleep(0.2)
"""


class HealthProbe:
    """Probes /health while in use; ``slow`` lists the answers that were late or not 200."""

    def __init__(self, url: str):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.command = [sys.executable, "-c", PROBE, host, port]
        self.answers: list[tuple[str, float]] = []

    def __enter__(self) -> HealthProbe:
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait()
        self.reader.join()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            status, seconds = line.split()
            self.answers.append((status, float(seconds)))

    @property
    def probes(self) -> int:
        return len(self.answers)

    @property
    def slow(self) -> list[str]:
        return [f"{s} after {t:.2f} s" for s, t in self.answers if s != "200" or t > 1.0]


def attack_overload(budget: Budget, rng: random.Random, live: LiveServer, tally: Tally) -> None:
    server = live.get()
    before = _total_requests(server.url)
    storm = Budget.of(max(budget.left() * 0.5, 1.0))
    sent = [0]
    lock = threading.Lock()

    def client(seed: int) -> None:
        local = random.Random(seed)
        while not storm.spent():
            path, body = _storm_request(local, server.model)
            abandon = local.random() < 0.15  # leaves while queued or running
            timeout = local.uniform(0.1, 0.5) if abandon else HANG_SECONDS
            with lock:
                sent[0] += 1
            what = f"POST {path} {short(json.dumps(body), 200)}"
            tally.case(_storm_problem(server.url, path, body, timeout, abandon, what))

    with HealthProbe(server.url) as probe, ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(client, [rng.randrange(2**32) for _ in range(CLIENTS)]))
    if probe.slow:
        tally.fail(f"/health late or failing {len(probe.slow)} of {probe.probes} times during "
                   f"the storm (first: {probe.slow[0]})")  # fmt: skip
    expected = before + sent[0]
    deadline = time.monotonic() + min(5.0, budget.left())  # cancellations settle
    while _total_requests(server.url) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    counted = _total_requests(server.url)
    if counted != expected:
        tally.fail(
            f"ninfer_requests_total counted {counted - before:.0f} of {sent[0]} storm requests "
            "(some abandoned by the client) <- --only overload"
        )
    _large_prompt(budget, rng, server, tally)


def _storm_problem(
    url: str, path: str, body: dict, timeout: float, abandon: bool, what: str
) -> str | None:
    import httpx

    try:
        with httpx.stream("POST", f"{url}{path}", json=body, timeout=timeout) as response:
            data = response.read()
    except httpx.TimeoutException:
        return None if abandon else f"no answer within {timeout:.0f} s <- {what}"
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {short(str(exc))} <- {what}"
    if response.status_code >= 500 and response.status_code not in ALLOWED_5XX:
        return f"{response.status_code} {short(data[:120])} <- {what}"
    return None


#: A prompt far beyond the context: it must be refused without freezing the server.
LARGE_PROMPT_BYTES = 4 << 20
#: Byte -> letter or space: random words, so the tokenizer's word cache cannot shortcut them.
LETTERS = bytes((b"abcdefghijklmnopqrstuvwxyz" * 10 + b" " * 60)[i] for i in range(256))


def _large_prompt(budget: Budget, rng: random.Random, server: Any, tally: Tally) -> None:
    import httpx

    if budget.left() < 3:
        return
    text = rng.randbytes(LARGE_PROMPT_BYTES).translate(LETTERS).decode()
    body = {"model": server.model, "messages": [{"role": "user", "content": text}]}
    what = f"POST /v1/chat/completions with a {LARGE_PROMPT_BYTES >> 20} MiB prompt"
    problems = []
    wait = max(budget.left(), 1.0)
    with HealthProbe(server.url) as probe:
        try:
            response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=wait)
            if response.status_code >= 500 and response.status_code not in ALLOWED_5XX:
                problems.append(f"answered {response.status_code}")
        except httpx.TimeoutException:
            problems.append(f"no answer within {wait:.1f} s")
    if probe.slow:
        problems.append(f"/health late or failing {len(probe.slow)} of {probe.probes} times "
                        f"(first: {probe.slow[0]})")  # fmt: skip
    tally.case(problems and f"{'; '.join(problems)} <- {what}")
