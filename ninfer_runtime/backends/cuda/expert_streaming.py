"""Expert offload's streamed experts on the device: kept in pinned host memory and prefetched.

A prefill chunk under ``--vram-budget`` streams the host experts it routes to through the
device (``expert_offload.stream_window``), each layer in turn. Cut from the mapped banks at
every chunk, an expert would cost two host copies and a staged (pageable) upload: the host's
memcpy rate, a few GB/s. So:

* ``PinnedCuts``: the first time a streamed expert's row window is cut, its stored bytes are
  kept in pinned (page-locked) host memory, within a byte allowance; every later upload of
  that window is a DMA at the link's rate that the host only issues;
* ``Prefetch``: while a layer computes, the next MoE layer's streamed experts are prepared
  on a second stream (uploaded and tile packed there); the main stream waits for that work
  only when the next layer prepares those experts (``settle``).

Stream order: a prefetch begins after everything the main stream was given before it (its
stream waits on the main stream's event), so device memory the main stream freed is never
overwritten under a kernel still reading it; the main stream waits on the prefetch's event
before anything reads what it made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

__all__ = ["PinnedCuts", "Prefetch"]


class PinnedCuts:
    """Stored bytes of cut row windows, by cut key, in host memory from ``empty`` (pinned on
    the GPU), up to ``capacity`` bytes; windows past it are not kept."""

    def __init__(self, capacity: int, empty: Callable[[int], np.ndarray]):
        self.capacity, self.empty = capacity, empty
        self.used = 0
        self._kept: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: str) -> np.ndarray | None:
        return self._kept.get(key)

    def keep(self, key: str, data: bytes) -> np.ndarray:
        """``data`` as the array to upload from: a kept copy while the allowance lasts."""
        host = np.frombuffer(data, dtype=np.uint8)
        if self.used + host.size > self.capacity:
            return host
        kept = self.empty(host.size)
        kept[...] = host
        self._kept[key] = kept
        self.used += host.size
        return kept


class Prefetch:
    """Work issued on a second stream, which the main stream waits for only when it reads
    what that work made (see the module docstring)."""

    def __init__(self, cp: Any):
        self.cp = cp
        self.stream = cp.cuda.Stream(non_blocking=True)
        self._done: Any = None
        #: what the last ``start`` made, until the next start hands it back
        self.made: list[Any] = []

    def start(self, work: Callable[[], Iterable[Any]]) -> list[Any]:
        """Run ``work`` (which issues device work and returns what it made) on the second
        stream, after everything given to the main stream so far; returns what the previous
        start made (for the caller to release what its layer did not use)."""
        self.settle()
        before, self.made = self.made, []
        main = self.cp.cuda.get_current_stream()
        self.stream.wait_event(main.record())
        with self.stream:
            self.made = list(work())
        self._done = self.stream.record()
        return before

    def settle(self) -> None:
        """Make the current stream wait for the last ``start``'s work (no host wait)."""
        if self._done is not None:
            self.cp.cuda.get_current_stream().wait_event(self._done)
            self._done = None
