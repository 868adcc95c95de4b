"""The engine thread posts what the pool counters gained; an empty prefix cache is a cache."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ninfer_runtime.prefix_cache import PrefixCache
from ninfer_runtime.state import ContextPool, KvSpec
from ninfer_serve.engine_loop import EngineLoop


def test_gains_are_increments_even_when_the_cache_empties() -> None:
    """A cache that has let every checkpoint go still counts its evictions (it once read
    as false when empty, and the counters went down and up again)."""
    pool = ContextPool([KvSpec(1, 4)], np, slots=1, pages=1, max_context=4, page_tokens=4)
    cache = PrefixCache(pool)
    stats = cache.stats
    engine = SimpleNamespace(cache=cache, preemptions=0, replayed_tokens=0)
    loop = EngineLoop.__new__(EngineLoop)  # only the counters' bookkeeping is exercised
    loop._memory_seen = {}
    stats.evictions, engine.preemptions, engine.replayed_tokens = 3, 1, 40
    assert loop._memory_gained(engine) == {
        "cache_evictions": 3,
        "preemptions": 1,
        "replayed_tokens": 40,
    }
    assert not cache.checkpoints()  # empty
    engine.preemptions = 2
    assert loop._memory_gained(engine) == {"preemptions": 1}
    assert loop._memory_gained(engine) == {}
