"""The pool's free pages and how many holders each page has.

A page is held by every sequence and checkpoint whose tokens (or snapshot) it stores: a
prefix-cache checkpoint shares its full K/V pages with the sequences continuing it, so a page
goes back to the free list only when its last holder lets it go. Pages are taken from the
low ids up and given back in reverse, so a pool that empties refills in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class PageAllocator:
    """Free page ids of ``pages`` pages and each page's holder count."""

    def __init__(self, pages: int):
        self._free = list(range(pages))[::-1]
        self._holders = np.zeros(pages, dtype=np.int64)

    @property
    def free(self) -> int:
        return len(self._free)

    def free_ids(self) -> list[int]:
        """The free page ids (the next one taken last)."""
        return list(self._free)

    def take(self, count: int) -> list[int]:
        """``count`` free pages, each now held once (the caller checks ``free`` first)."""
        pages = [self._free.pop() for _ in range(count)]
        self._holders[pages] += 1
        return pages

    def hold(self, pages: Iterable[int]) -> None:
        """One more holder for each of ``pages`` (already held ones: shared)."""
        self._holders[list(pages)] += 1

    def release(self, pages: list[int]) -> None:
        """One holder fewer for each of ``pages``; those held by none are free again."""
        self._holders[pages] -= 1
        self._free.extend(p for p in reversed(pages) if self._holders[p] == 0)

    def holders(self) -> np.ndarray:
        """How many sequences and checkpoints hold each page (0: free)."""
        return self._holders.copy()
