"""The engine thread posts what the pool counters gained; an empty prefix cache is a cache."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ninfer_runtime.ops.attention.memory import KvSpec
from ninfer_runtime.prefix_cache import PrefixCache
from ninfer_runtime.state import ContextPool
from ninfer_serve.engine_readings import CounterGains


def test_gains_are_increments_even_when_the_cache_empties() -> None:
    """A cache that has let every checkpoint go still counts its evictions (it once read
    as false when empty, and the counters went down and up again)."""
    pool = ContextPool([KvSpec(1, 4)], np, slots=1, pages=1, max_context=4, page_tokens=4)
    cache = PrefixCache(pool)
    stats = cache.stats
    engine = SimpleNamespace(cache=cache, preemptions=0, replayed_tokens=0)
    gains = CounterGains()
    stats.evictions, engine.preemptions, engine.replayed_tokens = 3, 1, 40
    assert gains.memory(engine) == {
        "cache_evictions": 3,
        "preemptions": 1,
        "replayed_tokens": 40,
    }
    assert not cache.checkpoints()  # empty
    engine.preemptions = 2
    assert gains.memory(engine) == {"preemptions": 1}
    assert gains.memory(engine) == {}


def test_memory_settings_are_read_and_bad_sizes_named(tmp_path) -> None:
    import pytest

    from ninfer_serve.config import ConfigError, load_settings

    config = tmp_path / "ninfer.toml"
    config.write_text("[engine]\nmemory_headroom = '6GiB'\nhost_context_capacity = '0'\n")
    engine = load_settings(config, {}).engine
    assert (engine.memory_headroom, engine.host_context_capacity) == ("6GiB", "0")
    defaults = load_settings(None, {}).engine
    assert (defaults.memory_headroom, defaults.host_context_capacity) == (None, "4GiB")
    flags = {"engine": {"host_context_capacity": "1GiB"}}
    assert load_settings(config, flags).engine.host_context_capacity == "1GiB"
    refused = {
        "memory_headroom = 'lots'": "memory headroom 'lots': expected a size",
        "host_context_capacity = 'auto'": "host context capacity 'auto': expected a size",
        "host_context_capacity = '-1G'": "host context capacity '-1G' must not be negative",
    }
    for line, message in refused.items():
        config.write_text(f"[engine]\n{line}\n")
        with pytest.raises(ConfigError, match=f"^{config}: .*{message}") as error:
            load_settings(config, {})
        assert "\n" not in str(error.value)
