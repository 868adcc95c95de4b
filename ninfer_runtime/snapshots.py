"""Checkpoints and the snapshots of slot states they keep in pages.

A prefix-cache checkpoint holds the K/V pages covering its tokens (shared with the sequence
that wrote them) and a **snapshot**: a copy of the sequence's slot states (GDN's recurrent
and convolution states, ...) written byte for byte into pages of its own, laid end to end
across the paged layers' page memory. So the pages stay the one shared store, and a
checkpoint costs whole pages like everything else in the pool.
"""

from __future__ import annotations

import ctypes
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Array = Any


@dataclass(frozen=True)
class Checkpoint:
    """A sequence's memory after ``length`` consumed tokens, kept when it moves on or ends:
    the K/V pages covering them (shared: the pool counts each page's holders), the pages its
    slot states were copied into (``snapshot``, its own), and with speculative decoding the
    main model's hidden row of the last token (the drafter pairs it with the next token; the
    MTP entries of the tokens before it are in the pages)."""

    length: int
    pages: tuple[int, ...]
    snapshot: tuple[int, ...]
    hidden: Array | None = None
    #: the last token's logits [V], when kept: a request whose whole prompt this is starts
    #: generating from them with nothing to prefill
    logits: Array | None = None
    #: why it was kept (``prefix_cache.CHECKPOINT_KINDS``)
    kind: str = "prompt_end"


class SnapshotLayout:
    """Where each byte of a sequence's slot states goes in a snapshot of a pool's memory:
    the states (``state_parts``, each array's row ``slot`` a sequence's) laid end to end,
    filling page after page of the page parts (each array's row ``p`` page ``p``'s memory;
    a page its parts one after the other). The layout is a table of contiguous runs, and a
    copy moves every run of the states it names in one call: on the device one launch,
    where a run at a time was a launch each (a 27B snapshot is ~300 runs).

    The arrays must be C-contiguous; the layout holds them (it copies by their addresses),
    so they are the pool's own, allocated once."""

    #: the table's columns: state part, byte in its row, snapshot page, page part, byte in
    #: its row, bytes
    COLUMNS = ("state", "state_at", "page", "part", "page_at", "size")

    def __init__(self, page_parts: Sequence[Array], state_parts: Sequence[Array]):
        arrays = [*page_parts, *state_parts]
        if not all(array.flags.c_contiguous for array in arrays):
            raise ValueError("SnapshotLayout: the pool's arrays must be C-contiguous")
        #: held, so that the addresses below stay theirs and the identities stay unique
        self._arrays = arrays
        #: CuPy memory (copied by a kernel), else host memory (numpy, or arrays over it)
        self.on_device = bool(arrays) and _device_pointer(arrays[0]) is not None
        page_rows = [_row_bytes(part) for part in page_parts]
        runs = []
        if sum(page_rows):
            page, part, at = 0, 0, 0
            for state, source in enumerate(state_parts):
                done, size = 0, _row_bytes(source)
                while done < size:
                    n = min(size - done, page_rows[part] - at)
                    runs.append((state, done, page, part, at, n))
                    done, at = done + n, at + n
                    if at == page_rows[part]:
                        part, at = part + 1, 0
                        if part == len(page_rows):
                            page, part = page + 1, 0
        #: int64 [runs, 6]: one contiguous run a row (``COLUMNS``)
        self.table = np.array(runs, dtype=np.int64).reshape(-1, len(self.COLUMNS))
        #: each state part's runs (rows of ``table``), and its index by the array's identity
        self._runs = [self.table[self.table[:, 0] == i] for i in range(len(state_parts))]
        self._index = {id(a): i for i, a in enumerate(state_parts)}
        self._state_base = np.array([_address(a) for a in state_parts], dtype=np.int64)
        self._state_row = np.array([_row_bytes(a) for a in state_parts], dtype=np.int64)
        self._page_base = np.array([_address(a) for a in page_parts], dtype=np.int64)
        self._page_row = np.array(page_rows, dtype=np.int64)

    @property
    def pages(self) -> int:
        """Pages one snapshot takes (0: no page memory, or no states)."""
        return int(self.table[:, 2].max()) + 1 if len(self.table) else 0

    def state_indices(self, arrays: Sequence[Array]) -> list[int]:
        """The indices of state parts given as the arrays themselves (a layer's own)."""
        try:
            return [self._index[id(a)] for a in arrays]
        except KeyError:
            raise ValueError("save_states: a state array that is not this pool's") from None

    def copy(
        self,
        targets: Sequence[tuple[int, Sequence[int]]],
        *,
        restore: bool,
        states: Collection[int] | None = None,
    ) -> None:
        """For every (slot, pages) of ``targets``: slot ``slot``'s states into the snapshot
        ``pages`` (``restore``: back), all in one call; ``states``: only those state parts
        (by index), else all."""
        t = self.table
        if states is not None:
            t = np.concatenate([self._runs[i] for i in states] or [t[:0]])
        if not len(t) or not targets:
            return
        state, state_at, page, part, page_at, size = t.T
        in_state, in_page = [], []
        for slot, pages in targets:
            in_state.append(self._state_base[state] + slot * self._state_row[state] + state_at)
            at = np.asarray(pages, dtype=np.int64)[page]
            in_page.append(self._page_base[part] + at * self._page_row[part] + page_at)
        src, dst = np.concatenate(in_state), np.concatenate(in_page)
        if restore:
            src, dst = dst, src
        copy_ranges(dst, src, np.tile(size, len(targets)), device=self.on_device)


def copy_ranges(dst: np.ndarray, src: np.ndarray, size: np.ndarray, *, device: bool) -> None:
    """``size[i]`` bytes from address ``src[i]`` to ``dst[i]`` for every i (int64 host
    arrays; the ranges must not overlap): in device memory by one kernel launch, in host
    memory by ``memmove``."""
    if device:
        from .backends.cuda.glue import copy_ranges as device_copy_ranges

        device_copy_ranges(dst, src, size)
        return
    for d, s, n in zip(dst.tolist(), src.tolist(), size.tolist(), strict=True):
        ctypes.memmove(d, s, n)


def _device_pointer(array: Array) -> int | None:
    """A CuPy array's device address (None: the array is in host memory)."""
    ptr = getattr(getattr(array, "data", None), "ptr", None)
    return int(ptr) if ptr is not None else None


def _address(array: Array) -> int:
    """Where ``array``'s first byte is (in device or host memory)."""
    ptr = _device_pointer(array)
    return ptr if ptr is not None else int(array.ctypes.data)


def _row_bytes(array: Array) -> int:
    """Bytes of one row of ``array`` (0 for an array without rows)."""
    return int(array[0].nbytes) if len(array) else 0
