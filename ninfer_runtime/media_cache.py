"""The vision tower's rows of recent images, kept by the image's digest.

A request that sends an image the engine has encoded before (the next turn of a chat about a
picture resends it) takes its rows from here and skips the encoder (and the decoder). An
entry is the image's patch grid and its rows (host float32 [merged tokens, hidden]); the
least recently used go first when the rows would exceed the byte budget
(``[media] cache_capacity``). An image is always encoded on its own, never batched with
others, so its rows are the same whichever request first sent it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

#: the byte budget when none is configured: about 6k merged tokens of a 5120-wide model
DEFAULT_CACHE_BYTES = 128 << 20


class EncodedImage(NamedTuple):
    """An image as the tower left it: its grid in patches (frames, rows, columns) and its
    rows, one per merged token."""

    grid: tuple[int, int, int]
    rows: np.ndarray


@dataclass
class MediaStats:
    """Images looked up, those found (the encoder skipped), and entries let go for room."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0


class MediaCache:
    """Encoded images by digest within ``capacity`` bytes of rows; an entry larger than the
    whole budget is not kept (capacity 0 keeps nothing)."""

    def __init__(self, capacity: int = DEFAULT_CACHE_BYTES):
        if capacity < 0:
            raise ValueError(f"media cache capacity must not be negative, got {capacity}")
        self.capacity = capacity
        self.bytes = 0
        self.stats = MediaStats()
        self._entries: OrderedDict[str, EncodedImage] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, digest: str) -> bool:
        return digest in self._entries

    def get(self, digest: str) -> EncodedImage | None:
        """The image kept for ``digest`` (a hit: now the most recently used), or None (a
        miss)."""
        kept = self._entries.get(digest)
        if kept is None:
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        self._entries.move_to_end(digest)
        return kept

    def peek(self, digest: str) -> EncodedImage | None:
        """The image kept for ``digest``, neither counted nor made more recent (a request
        being checked, not yet served)."""
        return self._entries.get(digest)

    def put(self, digest: str, image: EncodedImage) -> None:
        """Keep ``image`` for ``digest``, letting the least recently used go until it fits."""
        size = image.rows.nbytes
        if digest in self._entries or size > self.capacity:
            return
        while self.bytes + size > self.capacity:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.rows.nbytes
            self.stats.evictions += 1
        image.rows.setflags(write=False)  # shared by every request that sends the image
        self._entries[digest] = image
        self.bytes += size

    def take(self, digest: str) -> EncodedImage | None:
        """The entry kept for ``digest``, no longer kept (None: there is none)."""
        kept = self._entries.pop(digest, None)
        if kept is not None:
            self.bytes -= kept.rows.nbytes
        return kept

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0
