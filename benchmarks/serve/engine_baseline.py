"""The engine alone, in this process: the random workload through ``Engine.step`` with no HTTP
around it, so that the server's TPOT less the engine's is what serving adds to every token. The
engine and its device memory are released before a server is started beside it."""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

from .errors import BenchError
from .sample import Sample


def engine_level(
    model: Path,
    texts: list[str],
    output_len: int,
    concurrency: int,
    max_context: int,
    backend: str = "cpu",
    repeat: int = 1,
    warmup: list[str] = (),
) -> tuple[list[Sample], float]:
    """The same workload through ``Engine.step`` directly (the server's engine thread, minus
    everything around it), ``repeat`` times pooled, on an engine of its own that is released
    before this returns."""
    from ninfer_runtime.engine import Engine
    from ninfer_runtime.errors import EngineError

    try:
        # no context budget: pages for exactly ``concurrency`` lanes of ``max_context``
        # tokens (never "auto", which on a GPU would take the card), and no prefix cache
        engine = Engine(
            model,
            max_context=max_context,
            max_lanes=concurrency,
            backend=backend,
            context_capacity=None,
            prefix_cache=False,
        )
    except EngineError as exc:
        raise BenchError(f"engine baseline on {model}: {exc}") from None
    try:
        drive(engine, warmup, 4, concurrency)  # kernels and every lane count's step
        samples: list[Sample] = []
        duration = 0.0
        for _ in range(repeat):
            more, seconds = drive(engine, texts, output_len, concurrency)
            samples += more
            duration += seconds
        return samples, duration
    finally:
        del engine
        in_use = release_device_memory(backend)
        print(f"engine baseline released{f' ({in_use})' if in_use else ''}", flush=True)


def drive(
    engine: object, texts: list[str], output_len: int, concurrency: int
) -> tuple[list[Sample], float]:
    """``texts`` through ``engine`` with at most ``concurrency`` in flight, timed per token
    event (every generated token has one, whether or not it decodes to text)."""
    from ninfer_runtime.engine import Failed, Finished, GenerationRequest, TokenEvent
    from ninfer_runtime.frontend import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    pending = list(texts)
    samples: dict[str, Sample] = {}
    sent: dict[str, float] = {}
    last: dict[str, float] = {}
    done = 0
    started = time.perf_counter()
    while pending or engine.has_work:
        while pending and len(sent) - done < concurrency:
            request = GenerationRequest(
                messages=[{"role": "user", "content": pending.pop(0)}],
                enable_thinking=False,
                sampling=params,
            )
            rid = engine.submit(request)
            sent[rid] = time.perf_counter()
            samples[rid] = Sample(ttft_source="engine")
        for event in engine.step():
            now = time.perf_counter()
            sample = samples[event.request_id]
            if isinstance(event, TokenEvent):
                if event.request_id not in last:
                    sample.ttft = now - sent[event.request_id]
                else:
                    sample.itl.append(now - last[event.request_id])
                last[event.request_id] = now
            elif isinstance(event, Finished):
                sample.e2el = now - sent[event.request_id]
                sample.output_tokens = event.usage.completion_tokens
                sample.prompt_tokens = event.usage.prompt_tokens
                sample.ok = sample.output_tokens > 0
                done += 1
            elif isinstance(event, Failed):
                sample.error = str(event.error)
                done += 1
    return list(samples.values()), time.perf_counter() - started


def release_device_memory(backend: str) -> str:
    """Collect a released engine and hand the device memory CuPy keeps cached back to the
    driver, so that a server started next finds the card free; what is still in use, said
    in words ("" off the GPU)."""
    gc.collect()  # the engine's weights, pool and captured steps sit in reference cycles
    cupy = sys.modules.get("cupy")  # only a cuda engine imported it: never imported here
    if backend != "cuda" or cupy is None:
        return ""
    cupy.cuda.Device().synchronize()
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    free, total = cupy.cuda.runtime.memGetInfo()
    return f"{(total - free) / 2**30:.1f} of {total / 2**30:.1f} GiB of the GPU in use"


def engine_on(cpus: str | None, *args: object, **kwargs: object) -> tuple[list[Sample], float]:
    """``engine_level`` on the server's CPUs, so both runs get the same cores."""
    mine = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, {int(x) for x in cpus.split(",")})
    try:
        return engine_level(*args, **kwargs)  # type: ignore[arg-type]
    finally:
        os.sched_setaffinity(0, mine)
