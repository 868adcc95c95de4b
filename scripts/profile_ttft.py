"""Where a request's time to first token goes inside the engine, under the settings the server
uses and the ones the serve benchmark's engine baseline uses (a development aid).

    python scripts/profile_ttft.py ARTIFACT [--backend cuda] [--words 200] [--requests 12]

Runs the same chat requests one at a time through ``Engine.step(flush=...)`` (the server's
loop) for each setting: the prefix cache on or off, the context pool sized for one lane or
filling the device (``auto``, as ``ninfer-serve`` does). Prints the time from ``submit`` to the
first token (p50 over the requests after two warm-ups) and the p50 step, then the functions
taking the most time between submit and the first token with the server's settings.
"""

from __future__ import annotations

import cProfile
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = [
    "the",
    "capital",
    "of",
    "france",
    "is",
    "paris",
    "and",
    "the",
    "weather",
    "is",
    "sunny",
    "warm",
    "today",
    "tell",
    "me",
    "a",
    "joke",
]


def _requests(count: int, words: int) -> list:
    from ninfer_runtime.engine import GenerationRequest
    from ninfer_runtime.frontend import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    out = []
    for i in range(count):
        text = " ".join(random.Random(i).choice(WORDS) for _ in range(words))
        messages = [{"role": "user", "content": text}]
        out.append(GenerationRequest(messages=messages, enable_thinking=False, sampling=params))
    return out


def _first_token(engine, request) -> tuple[float, list[float]]:
    from ninfer_runtime.engine import TokenEvent

    start = time.perf_counter()
    first: list[float] = []
    steps: list[float] = []

    def flush(events) -> None:
        if not first and any(isinstance(e, TokenEvent) for e in events):
            first.append(time.perf_counter())

    engine.submit(request)
    while engine.has_work:
        t = time.perf_counter()
        flush(engine.step(flush=flush))
        steps.append(time.perf_counter() - t)
    return first[0] - start, steps


@click.command()
@click.argument("artifact", type=click.Path(exists=True, dir_okay=False))
@click.option("--backend", default="cpu", show_default=True)
@click.option("--words", type=int, default=200, show_default=True)
@click.option("--requests", "count", type=int, default=12, show_default=True)
def main(artifact: str, backend: str, words: int, count: int) -> None:
    from ninfer_runtime.engine import Engine

    requests = _requests(count, words)
    settings = [
        ("engine baseline (cache off, pool for the lanes)", {}),
        ("cache on, pool for the lanes", {"prefix_cache": True}),
        ("server (cache on, pool auto)", {"prefix_cache": True, "context_capacity": "auto"}),
    ]
    engine = None
    for name, kwargs in settings:
        engine = Engine(artifact, backend=backend, max_context=1024, max_lanes=1, **kwargs)
        ttft, steps = [], []
        for request in requests:
            t, s = _first_token(engine, request)
            ttft.append(t)
            steps += s
        print(
            f"{name:<48} TTFT p50 {1e3 * statistics.median(ttft[2:]):7.2f} ms   "
            f"step p50 {1e3 * statistics.median(steps):6.2f} ms   "
            f"pool {engine.pool.capacity_tokens} tokens"
        )
    profile = cProfile.Profile()
    profile.enable()
    _first_token(engine, _requests(1, words)[0])
    profile.disable()
    print("\nserver settings, one request to its end, by cumulative time:")
    pstats.Stats(profile).sort_stats("cumulative").print_stats(18)


if __name__ == "__main__":
    main()
