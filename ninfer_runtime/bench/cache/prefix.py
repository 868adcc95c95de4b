"""Cached prefix TTFT: one lane with the prefix cache on, a cold request timed from ``submit``
to its first token, then requests of the same prefix and fresh suffixes that resume from the
checkpoint the first one kept at the prefix boundary; each beside its FLOPs floor."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...engine import Engine, Finished, GenerationRequest, TokenEvent
from ...state import PAGE_TOKENS
from .. import measure as M
from .requests import greedy_params


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


def _first_token_s(engine: Engine, ids: np.ndarray) -> tuple[float, Finished]:
    """Seconds from submitting ``ids`` (one greedy token) to its first token, and its end."""
    request = GenerationRequest(
        prompt_ids=ids.tolist(), sampling=greedy_params(1), parse_output=False
    )
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
