"""Memory pressure: many requests at once in a pool too small for all of them at full length,
each of which must complete (through cache eviction and preemption) with the tokens it gets
unconstrained."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...engine import Engine, Finished, GenerationRequest, TokenEvent
from .requests import greedy_params


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
            prompt_ids=ids.tolist(), sampling=greedy_params(max_tokens), parse_output=False
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
