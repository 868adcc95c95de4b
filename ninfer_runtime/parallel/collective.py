"""How the ranks of a tensor-parallel model combine their partial results.

Split over ``world`` ranks, a block computes on each rank its share of the output (its
attention or GDN heads, its columns of the MLP): the block's output is the sum of the shares,
which ``all_reduce`` forms on every rank; the output head's vocabulary rows are split, and
``all_gather`` puts the ranks' logits side by side. ``Solo`` is the one-rank case;
``ThreadGroup`` runs the ranks as threads of one process, the CPU's simulation of a multi-GPU
run with the semantics of NCCL's collectives (every rank gets the same result).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..arrays import array_module, sync
from ..errors import EngineError

Array = Any


class CollectiveError(EngineError):
    """A rank stopped taking part (it failed, or never arrived): the collective is broken."""


def summed(parts: list[Array]) -> Array:
    """The ranks' shares added in rank order (the same bits wherever it is done)."""
    out = parts[0]
    for part in parts[1:]:
        out = out + part
    return out


def side_by_side(parts: list[Array]) -> Array:
    """The ranks' shares along the last axis, in rank order."""
    return np.concatenate(parts, axis=-1)


class Collective(Protocol):
    """One rank's view of its group."""

    rank: int
    world: int

    def all_reduce(self, x: Array) -> Array:
        """The sum over the ranks of each rank's ``x`` (same shape everywhere), on every rank."""
        ...

    def all_gather(self, x: Array) -> Array:
        """The ranks' ``x`` side by side along the last axis, in rank order, on every rank."""
        ...


@dataclass(frozen=True)
class Solo:
    """A model on one rank: nothing to combine."""

    rank: int = 0
    world: int = 1

    def all_reduce(self, x: Array) -> Array:
        return x

    def all_gather(self, x: Array) -> Array:
        return x


class ThreadGroup:
    """``world`` ranks as threads of one process. Each ``all_reduce`` sums the ranks' arrays
    in rank order, so every rank gets the same bits. A rank that does not arrive within
    ``timeout`` seconds, or calls ``abort`` (a rank that failed), breaks the group: the
    others raise ``CollectiveError`` instead of waiting for ever."""

    def __init__(self, world: int, timeout: float = 120.0):
        if world < 1:
            raise ValueError(f"a group needs at least one rank, not {world}")
        self.world, self.timeout = world, timeout
        self._barrier = threading.Barrier(world)
        self._parts: list[Array] = [None] * world
        self._reason = "another rank stopped taking part"

    def rank(self, rank: int) -> ThreadRank:
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is not in a group of {self.world}")
        return ThreadRank(self, rank)

    def abort(self, reason: str | None = None) -> None:
        """Break the group: every rank waiting in, or later entering, a collective raises
        ``CollectiveError`` (with ``reason``, say which rank failed and why)."""
        if reason:
            self._reason = reason
        self._barrier.abort()

    def _wait(self, rank: int) -> None:
        try:
            self._barrier.wait(self.timeout)
        except threading.BrokenBarrierError:
            raise CollectiveError(
                f"rank {rank} of {self.world}: {self._reason} (the group is broken)"
            ) from None


@dataclass(frozen=True)
class ThreadRank:
    """One thread's rank in a ``ThreadGroup``."""

    group: ThreadGroup
    rank: int

    @property
    def world(self) -> int:
        return self.group.world

    def all_reduce(self, x: Array) -> Array:
        return self._exchange(x, summed)

    def all_gather(self, x: Array) -> Array:
        return self._exchange(x, side_by_side)

    def _exchange(self, x: Array, combine: Callable[[list[Array]], Array]) -> Array:
        g = self.group
        g._parts[self.rank] = x
        # ranks sharing a GPU as threads issue on streams of their own, which order nothing
        # between them: each waits for its device around the exchange
        sync(array_module(x))  # written: the others read it
        g._wait(self.rank)  # every rank's share is in
        out = combine(list(g._parts))
        sync(array_module(out))  # read: its rank may free or overwrite each share
        g._wait(self.rank)  # every rank has read them: the slots may be reused
        return out
