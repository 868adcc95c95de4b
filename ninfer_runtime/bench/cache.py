"""The measuring half of ``ninfer-bench cache``: the prefix cache and a pool under pressure,
through the real ``Engine``.

**Cached prefix TTFT.** One lane with the prefix cache on: a request of ``prefix`` random
tokens and ``suffix`` more is timed from ``submit`` to its first token (cold), then requests of
the same prefix and fresh suffixes (cached: they resume from the checkpoint the first one
kept at the prefix boundary, ``checkpoint_interval = prefix``, and prefill only the suffix).
Each is shown beside its floor: the FLOPs of the tokens actually prefilled at the rate of a
measured matrix product (``measure.prefill_flops``, ``measure.matmul_rate``).

**Memory pressure.** ``requests`` requests of ``context`` tokens each (a random prompt, then
``max_tokens`` greedy tokens) submitted at once to an engine whose context capacity holds
only ``full_requests`` of them at full length beside the lanes' recurrent state (the
checkpoints' snapshots share those pages): every request must complete, through cache
eviction and preemption (replay, or with ``host_context_capacity`` a copy to host memory
and back), with the tokens of the same requests run unconstrained.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine import Engine, Finished, GenerationRequest, TokenEvent
from ..frontend import SamplingParams
from ..sizes import format_size
from ..state import PAGE_TOKENS
from . import measure as M
from .record import RunContext


class CacheMiss(Exception):
    """A request that should have resumed from the cached prefix did not."""


@dataclass
class PrefixResult:
    prefix: int
    suffix: int
    cold_ms: float
    #: median over the cached requests
    cached_ms: float
    cached_requests: int
    cached_tokens: int
    cold_floor_ms: float
    cached_floor_ms: float

    @property
    def ratio(self) -> float:
        return self.cached_ms / self.cold_ms


@dataclass
class PressureResult:
    requests: int
    full_requests: int
    context: int
    max_tokens: int
    capacity_bytes: int
    pool_pages: int
    pages_per_request: int
    completed: int
    wall_s: float
    generated: int
    most_running: int
    preemptions: int
    replayed_tokens: int
    #: host memory preempted lanes could be copied to (``"0"``: they replay)
    host_context_capacity: str
    #: whether every output equals the same request's in an unconstrained engine (None: not
    #: checked)
    matches: bool | None

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.wall_s


def _params(max_tokens: int) -> SamplingParams:
    # a random model may draw an end-of-sequence token at any point: the lengths stay fixed
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _first_token_s(engine: Engine, ids: np.ndarray) -> tuple[float, Finished]:
    """Seconds from submitting ``ids`` (one greedy token) to its first token, and its end."""
    request = GenerationRequest(prompt_ids=ids.tolist(), sampling=_params(1), parse_output=False)
    start, first, finished = time.perf_counter(), None, None
    for event in engine.generate(request):
        if isinstance(event, TokenEvent) and first is None:
            first = time.perf_counter()
        elif isinstance(event, Finished):
            finished = event
    assert first is not None and finished is not None
    return first - start, finished


def prefix_ttft(
    artifact: Any,
    backend: str,
    *,
    prefix: int,
    suffix: int,
    cached_requests: int = 3,
    chunk: int = 1024,
    kv_dtype: str = "float32",
    seed: int = 0,
) -> PrefixResult:
    """Cold and cached time to first token of a ``prefix`` + ``suffix`` token prompt."""
    engine = Engine(
        artifact,
        backend=backend,
        max_lanes=1,
        # pages for a request and, beside it, the checkpoints' (which share the full ones)
        max_context=2 * (prefix + suffix + PAGE_TOKENS),
        prefill_chunk=chunk,
        kv_dtype=kv_dtype,
        prefix_cache=True,
        checkpoint_interval=prefix,
    )
    rng = np.random.default_rng(seed)

    def tokens(n: int) -> np.ndarray:
        return rng.integers(0, engine.model.config.vocab, n)

    # warm-up (compiled steps, a resume from a checkpoint) on other tokens, then let it go
    warm = tokens(min(prefix, 2 * chunk) + suffix)
    _first_token_s(engine, warm)
    _first_token_s(engine, np.concatenate([warm, tokens(suffix)]))
    assert engine.cache is not None
    engine.cache.clear()

    shared = tokens(prefix)
    cold_s, _ = _first_token_s(engine, np.concatenate([shared, tokens(suffix)]))
    cached = []
    for _ in range(cached_requests):
        seconds, finished = _first_token_s(engine, np.concatenate([shared, tokens(suffix)]))
        if finished.usage.cached_tokens != prefix:
            raise CacheMiss(
                f"a request sharing the {prefix}-token prefix resumed from "
                f"{finished.usage.cached_tokens} cached tokens, expected {prefix}"
            )
        cached.append(seconds)
    rate = M.matmul_rate(engine.runner.backend.xp)
    model = engine.model
    return PrefixResult(
        prefix,
        suffix,
        1e3 * cold_s,
        1e3 * statistics.median(cached),
        cached_requests,
        prefix,
        1e3 * M.prefill_flops(model, prefix + suffix) / rate,
        1e3 * M.prefill_flops(model, suffix, past=prefix) / rate,
    )


@dataclass
class _Run:
    outputs: list[list[int]]
    completed: int
    wall_s: float
    most_running: int


def _run_together(engine: Engine, prompts: np.ndarray, max_tokens: int) -> _Run:
    """Every prompt submitted at once, stepped until all end: each one's token ids."""
    outputs: dict[str, list[int]] = {}
    for ids in prompts:
        request = GenerationRequest(
            prompt_ids=ids.tolist(), sampling=_params(max_tokens), parse_output=False
        )
        outputs[engine.submit(request)] = []
    completed, most = 0, 0
    start = time.perf_counter()
    while engine.has_work:
        events = engine.step()
        for event in events:
            if isinstance(event, TokenEvent):
                outputs[event.request_id].append(event.token_id)
            elif isinstance(event, Finished):
                completed += event.reason in ("stop", "length")
        most = max(most, engine.lanes_in_use)
        if not events and not engine.lanes_in_use:
            break  # a step that admitted nothing with no lane running: the rest never will
    return _Run(list(outputs.values()), completed, time.perf_counter() - start, most)


def memory_pressure(
    artifact: Any,
    backend: str,
    *,
    requests: int,
    full_requests: int,
    context: int,
    max_tokens: int,
    check: bool = True,
    chunk: int = 1024,
    kv_dtype: str = "float32",
    host_context_capacity: str = "0",
    seed: int = 1,
) -> PressureResult:
    """``requests`` requests at once in a pool that holds ``full_requests`` of them."""

    def engine(capacity: int | None) -> Engine:
        gc.collect()  # the engines before this one free their weights and pools first
        return Engine(
            artifact,
            backend=backend,
            max_lanes=requests,
            max_context=context,
            prefill_chunk=chunk,
            kv_dtype=kv_dtype,
            prefix_cache=True,
            context_capacity=capacity,
            host_context_capacity=host_context_capacity if capacity is not None else 0,
        )

    unconstrained = engine(None)
    pool = unconstrained.pool
    # what the pool holds besides pages (the lanes' state slots), and the pages
    pages = full_requests * pool.pages_for(context)
    capacity = pool.nbytes() - pool.pages * pool.page_bytes + pages * pool.page_bytes
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, unconstrained.model.config.vocab, (requests, context - max_tokens))
    expected = _run_together(unconstrained, prompts, max_tokens).outputs if check else None
    per_request = pool.pages_for(context)
    del unconstrained, pool

    constrained = engine(capacity)
    run = _run_together(constrained, prompts, max_tokens)
    return PressureResult(
        requests,
        full_requests,
        context,
        max_tokens,
        capacity,
        constrained.pool.pages,
        per_request,
        run.completed,
        run.wall_s,
        sum(len(o) for o in run.outputs),
        run.most_running,
        constrained.preemptions,
        constrained.replayed_tokens,
        host_context_capacity,
        None if expected is None else run.outputs == expected,
    )


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The tables of a run's ``--json`` rows, in markdown (printed and recorded alike)."""
    lines: list[str] = []
    for r in rows:
        if r["kind"] == "prefix ttft":
            lines += [
                f"Time to first token of a {r['prefix']} + {r['suffix']}-token prompt, one "
                f"lane: cold, and resumed from its cached {r['prefix']}-token prefix (median "
                f"of {r['cached_requests']}, fresh suffixes); floor: FLOPs of the tokens "
                "prefilled at the measured matmul rate.",
                "",
                "| prefix | suffix | cold ms | floor ms | cached ms | floor ms | cached tokens "
                "| cached / cold |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|",
                f"| {r['prefix']} | {r['suffix']} | {r['cold_ms']:.1f} "
                f"| {r['cold_floor_ms']:.1f} | {r['cached_ms']:.1f} "
                f"| {r['cached_floor_ms']:.2f} | {r['cached_tokens']} "
                f"| {100 * r['ratio']:.1f}% |",
                "",
            ]
        elif r["kind"] == "pressure":
            matches = {None: "not checked", True: "yes", False: "NO"}[r["matches"]]
            lines += [
                f"Memory pressure: {r['requests']} requests at once of {r['context']} tokens "
                f"({r['context'] - r['max_tokens']} prompt + {r['max_tokens']} greedy), pool "
                f"sized for {r['full_requests']} at full length ({r['pool_pages']} pages of "
                f"the {r['requests'] * r['pages_per_request']} all would take, "
                f"{format_size(r['capacity_bytes'])} with the lanes' state slots); host "
                f"memory for preempted lanes: {r.get('host_context_capacity', '0')}.",
                "",
                "| completed | wall s | generated tok/s | most running | preemptions "
                "| replayed tokens | outputs as unconstrained |",
                "|---:|---:|---:|---:|---:|---:|:---|",
                f"| {r['completed']} / {r['requests']} | {r['wall_s']:.2f} "
                f"| {r['tokens_per_s']:.1f} | {r['most_running']} | {r['preemptions']} "
                f"| {r['replayed_tokens']} | {matches} |",
                "",
            ]
    return lines


def markdown(rows: list[dict[str, Any]], ctx: RunContext) -> str:
    """One ``--record`` section for a run's rows."""
    return "\n".join(
        [
            f"### `ninfer-bench cache` {ctx.artifact}, {ctx.date}",
            "",
            f"{ctx.device}, commit {ctx.commit}, K/V {ctx.kv_dtype}, "
            f"device-to-device copy {ctx.copy_gbps:.0f} GB/s (read + write).",
            "",
            *table_lines(rows),
        ]
    )
