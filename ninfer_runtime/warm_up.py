"""A server's first prefill chunk run before any request.

A prefill's kernels pay a cost on their first call in a process: modules load, and
fla-core's Triton kernels (the delta rule's bulk prefill on CUDA) tune their launch
configurations, and compile when Triton's disk cache is cold. The first 4,137-token prompt
of a fresh 27B server took 4.7 s (34.2 s with Triton's cache cold) where the next ones took
a few hundred milliseconds (docs/performance.md). ``warm_up`` runs one prefill chunk of the
engine's size through a scratch sequence and gives the sequence back, so that cost is part
of starting the server (whose health check answers 503 until then) rather than of its first
long prompt. The scratch sequence never reaches the prefix cache or the scheduler.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .engine import Engine


def warm_up(engine: Engine) -> float:
    """One prefill chunk of ``engine.prefill_chunk`` tokens (at most its context less one,
    and what its pool's free pages hold) through a scratch sequence of its pool, closed
    after: the seconds it took."""
    started = time.perf_counter()
    pool = engine.pool
    tokens = min(engine.prefill_chunk, engine.max_context - 1, pool.free_pages * pool.page_tokens)
    ids = np.arange(tokens, dtype=np.int64) % engine.model.config.vocab
    state = pool.open(tokens)
    try:
        engine.runner.prefill(ids, state, chunk=tokens, last_only=True)
    finally:
        pool.close(state)
    return time.perf_counter() - started
