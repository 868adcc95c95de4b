"""Ranks as processes, joined by pipes: the layout one process per GPU needs, with the CPU
doing the combining (on GPUs, NCCL would carry the collectives and the pipes only the
plan).

Rank 0 has two pipes to every other rank: one carries the plan (``mirror.Call`` messages,
rank 0 to the rank), the other the collectives (each rank sends its share to rank 0, which
combines the shares in rank order and sends the result back, so every rank gets the same
bits). A rank that fails sends its error down its collective pipe before it exits, and a
rank whose process ended is noticed by the closed pipe: either way the others raise
``CollectiveError`` naming it, instead of waiting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from .collective import CollectiveError, side_by_side, summed

Array = Any


@dataclass(frozen=True)
class Failure:
    """What a failing rank sends instead of its share."""

    rank: int
    message: str


class PipeRank:
    """One process's rank. ``links``: on rank 0 its pipes to ranks 1 .. world - 1 in order,
    on any other rank its one pipe to rank 0."""

    def __init__(self, rank: int, world: int, links: list[Connection], timeout: float = 600.0):
        self.rank, self.world, self.links, self.timeout = rank, world, links, timeout

    def all_reduce(self, x: Array) -> Array:
        return self._exchange(x, summed)

    def all_gather(self, x: Array) -> Array:
        return self._exchange(x, side_by_side)

    def share(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (what the others pass is ignored)."""
        if self.rank != 0:
            return self._receive(self.links[0], 0)
        for link in self.links:
            link.send(value)
        return value

    def wait_for_failure(self) -> str:
        """Block until a peer's pipe speaks or closes (pipes that carry nothing else, as under
        NCCL) -> what ``CollectiveError`` would say about it."""
        ready = wait(self.links)[0]
        peer = 0 if self.rank != 0 else self.links.index(ready) + 1
        try:
            self._receive(ready, peer)
        except CollectiveError as exc:
            return str(exc)
        return f"rank {self.rank} of {self.world}: rank {peer} sent on the pipes unasked"

    def fail(self, message: str) -> None:
        """Tell the group this rank failed (rank 0: every other rank; others: rank 0)."""
        for link in self.links:
            with contextlib.suppress(OSError):  # a rank already gone
                link.send(Failure(self.rank, message))

    def _exchange(self, x: Array, combine: Callable[[list[Array]], Array]) -> Array:
        if self.rank != 0:
            self.links[0].send(x)
            return self._receive(self.links[0], 0)
        parts = [x] + [self._receive(link, r) for r, link in enumerate(self.links, start=1)]
        out = combine(parts)
        for link in self.links:
            link.send(out)
        return out

    def _receive(self, link: Connection, rank: int) -> Array:
        where = f"rank {self.rank} of {self.world}"
        try:
            if not link.poll(self.timeout):
                raise CollectiveError(f"{where}: rank {rank} sent nothing in {self.timeout:.0f} s")
            value = link.recv()
        except (EOFError, OSError):
            raise CollectiveError(f"{where}: rank {rank}'s process ended") from None
        if isinstance(value, Failure):
            raise CollectiveError(f"{where}: rank {value.rank} failed: {value.message}")
        return value


class Outbox:
    """The plan's sending end, as ``mirror.Leader`` uses a queue."""

    def __init__(self, link: Connection):
        self.link = link

    def put(self, message: Any) -> None:
        with contextlib.suppress(OSError):  # the rank is gone: its collective pipe says so
            self.link.send(message)


class Inbox:
    """The plan's receiving end, as ``mirror.follow`` uses a queue (None once rank 0 is
    gone)."""

    def __init__(self, link: Connection):
        self.link = link

    def get(self) -> Any:
        try:
            return self.link.recv()
        except (EOFError, OSError):
            return None
