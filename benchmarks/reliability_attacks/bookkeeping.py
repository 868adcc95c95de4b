"""What every attack family shares: its time budget, the tally of cases and failures it
reports, and two small helpers (taking turns between case streams, shortening what a failure
quotes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Budget:
    """A deadline on the monotonic clock."""

    deadline: float

    @classmethod
    def of(cls, seconds: float) -> Budget:
        return cls(time.monotonic() + seconds)

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def spent(self) -> bool:
        return self.left() <= 0


@dataclass
class Tally:
    family: str
    cases: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def case(self, problem: str | None = None) -> None:
        """Count one case; ``problem`` (with its reproduction) makes it a failure."""
        with self._lock:
            self.cases += 1
            if problem:
                self.failures.append(problem)

    def count(self, cases: int) -> None:
        """Count cases run elsewhere (their failures come through ``fail``)."""
        with self._lock:
            self.cases += cases

    def fail(self, problem: str) -> None:
        """A failure found outside any single case (e.g. a counter checked at the end)."""
        with self._lock:
            self.failures.append(problem)


def interleaved(*streams: Iterator[Any]) -> Iterator[Any]:
    """One item of each stream in turn; a stream that ends drops out."""
    live = list(streams)
    while live:
        for stream in list(live):
            try:
                yield next(stream)
            except StopIteration:
                live.remove(stream)


def short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}...({len(text)} chars)"
