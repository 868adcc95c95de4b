"""What the engine thread reads off the engine for the metrics after a step.

The engine keeps its counters as totals (speculative rounds, pool and media-cache counters,
prefix-cache lookups); ``CounterGains`` turns them into the increments since its previous
reading, so every event is counted once however the steps and the posts interleave. A
``Readings`` carries those and the gauges to the asyncio side, which feeds them to ``Metrics``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from ninfer_runtime.engine import Engine
from ninfer_runtime.speculative import SpecStats

from .metrics import Metrics

__all__ = ["CounterGains", "Gains", "Readings"]


@dataclass
class Gains:
    """The engine's counters' increments since the previous reading."""

    spec: SpecStats | None
    memory: dict[str, int]
    lookups: tuple[int, int] | None

    @property
    def moved(self) -> bool:
        return self.spec is not None or bool(self.memory) or self.lookups is not None


@dataclass
class Readings:
    """One post's metrics: the counters' gains and the gauges at the end of the step."""

    gains: Gains
    lanes: int
    context_usage: float
    pool_bytes: dict[str, int]
    host_bytes: int
    checkpoints: dict[str, int] | None

    @classmethod
    def of(cls, engine: Engine, gains: Gains) -> Readings:
        return cls(
            gains,
            engine.lanes_in_use,
            engine.context_usage,
            engine.pool_bytes(),
            engine.host_bytes,
            engine.cache.checkpoint_counts() if engine.cache is not None else None,
        )

    def feed(self, metrics: Metrics) -> None:
        metrics.set_lanes(self.lanes, self.context_usage, self.pool_bytes, self.host_bytes)
        if self.gains.spec is not None:
            metrics.speculated(self.gains.spec)
        if self.gains.memory:
            metrics.memory(self.gains.memory)
        if self.gains.lookups is not None:
            metrics.looked_up(*self.gains.lookups)
        if self.checkpoints is not None:
            metrics.set_checkpoints(self.checkpoints)


class CounterGains:
    """The engine's totals as seen at the previous reading (engine thread only)."""

    def __init__(self) -> None:
        #: the engine's speculative totals at the last reading
        self._spec_seen: SpecStats | None = None
        #: the engine's pool counters at the last reading
        self._memory_seen: dict[str, int] = {}
        #: the prefix cache's (queried, hit) token totals at the last reading
        self._lookups_seen = (0, 0)

    def take(self, engine: Engine) -> Gains:
        return Gains(self.spec(engine.spec_stats), self.memory(engine), self.lookups(engine))

    def memory(self, engine: Engine) -> dict[str, int]:
        """The engine's pool and media-cache counters' increments since the previous call
        (only those that moved)."""
        totals = {
            "cache_evictions": engine.cache.stats.evictions if engine.cache is not None else 0,
            "preemptions": engine.preemptions,
            "replayed_tokens": engine.replayed_tokens,
        }
        media = getattr(engine, "media_cache", None)  # None: the model takes no images
        if media is not None:
            totals["media_cache_hits"] = media.stats.hits
            totals["media_cache_misses"] = media.stats.misses
            totals["media_cache_evictions"] = media.stats.evictions
        offload = getattr(engine, "expert_offload", None)  # None: no --vram-budget
        if offload is not None:
            totals.update(offload.counters.totals())
        gained = {k: v - self._memory_seen.get(k, 0) for k, v in totals.items()}
        self._memory_seen = totals
        return {k: v for k, v in gained.items() if v}

    def lookups(self, engine: Engine) -> tuple[int, int] | None:
        """The prompt tokens the engine's prefix cache was asked for and those it resumed
        since the previous call (None: no lookup, or no cache). The engine counts them when
        it admits a request, the one moment it knows how much of the prompt is cached."""
        if engine.cache is None:
            return None
        stats = engine.cache.stats
        seen_queried, seen_hit = self._lookups_seen
        if stats.queried_tokens == seen_queried:
            return None
        self._lookups_seen = (stats.queried_tokens, stats.hit_tokens)
        return stats.queried_tokens - seen_queried, stats.hit_tokens - seen_hit

    def spec(self, totals: SpecStats | None) -> SpecStats | None:
        """What the engine's speculative ``totals`` gained since the previous call (None:
        nothing, or no speculation). Counters move by these increments, so every round is
        counted once however the steps and the posts interleave."""
        if totals is None:
            return None
        seen = self._spec_seen or SpecStats(totals.draft_tokens)
        if (totals.rounds, totals.fallbacks) == (seen.rounds, seen.fallbacks):
            return None
        self._spec_seen = copy.deepcopy(totals)
        per_position = zip(totals.accepted_per_position, seen.accepted_per_position, strict=True)
        return SpecStats(
            totals.draft_tokens,
            rounds=totals.rounds - seen.rounds,
            fallbacks=totals.fallbacks - seen.fallbacks,
            drafted=totals.drafted - seen.drafted,
            accepted=totals.accepted - seen.accepted,
            accepted_per_position=[now - before for now, before in per_position],
        )
