"""How many decode lanes (requests generating at once) a server opens.

``max_concurrency = "auto"`` (the default) opens as many lanes as the engine runs (its
backend's most, ``ninfer_runtime.lane_limits``, at most ``AUTO_LANES``), fewer when the context
pool could not give each of them a useful context at once: a lane is opened only
while every open lane can hold ``min(max_context, LANE_CONTEXT_TOKENS)`` tokens of K/V pages
together with the others. The engine is built with its most lanes (their recurrent-state
slots come out of the budget first), so the rule reads the pool it built: pages divided by
the pages one such context takes. More lanes than that would mostly wait for pages or be
preempted; fewer leaves the batch, and so the throughput of concurrent clients, smaller
than the memory allows. A number pins the lanes as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ninfer_runtime.lane_limits import COMMON_LANES, backend_max_lanes

if TYPE_CHECKING:
    from ninfer_runtime.engine import Engine

__all__ = ["AUTO_LANES", "LANE_CONTEXT_TOKENS", "LaneChoice", "choose_lanes", "engine_lanes"]

#: the most lanes ``auto`` builds an engine with, those every backend runs: the CPU's pool has
#: no device budget to bound it, and would reserve a whole context for each of its 64 lanes
#: (a number pins more)
AUTO_LANES = COMMON_LANES

#: the context each auto lane must be able to hold at once: a chat prompt with a long reply,
#: or an agent's system prompt and tools with a few turns (longer requests still run, their
#: pages taken from lanes holding less, or waiting)
LANE_CONTEXT_TOKENS = 4096

LaneSetting = int | Literal["auto"]


@dataclass(frozen=True)
class LaneChoice:
    lanes: int
    #: why this many, for the start-up line
    reason: str


def engine_lanes(setting: LaneSetting, backend: str) -> int:
    """The lanes the engine is built with: the pinned number, or for ``auto`` the most the
    ``backend`` runs, at most ``AUTO_LANES``."""
    return min(backend_max_lanes(backend), AUTO_LANES) if setting == "auto" else int(setting)


def choose_lanes(setting: LaneSetting, engine: Engine) -> LaneChoice:
    """The lanes to open on the loaded ``engine`` (see the module's rule)."""
    if setting != "auto":
        return LaneChoice(int(setting), "--max-concurrency")
    pool = engine.pool
    tokens = min(engine.max_context, LANE_CONTEXT_TOKENS)
    fit = pool.pages // max(pool.pages_for(tokens), 1)
    lanes = max(1, min(engine.max_lanes, fit))
    if lanes == engine.max_lanes:
        reason = f"auto: the engine's most; the context pool holds {fit} lanes of {tokens} tokens"
    else:
        reason = f"auto: the context pool holds {lanes} lane(s) of {tokens} tokens"
    return LaneChoice(lanes, reason)
