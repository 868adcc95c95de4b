"""Expert offload's streamed experts on the device: kept in pinned host memory and prefetched.

A prefill chunk under ``--vram-budget`` streams the host experts it routes to through the
device (``expert_offload.stream_window``), each layer in turn. Cut from the mapped banks at
every chunk, an expert would cost two host copies and a staged (pageable) upload: the host's
memcpy rate, a few GB/s. So:

* ``PinnedCuts``: the first time a streamed expert's row window (a cut) is made, its stored
  bytes are kept in pinned (page-locked) host memory, within a byte allowance, next to the
  cut kept before it. Every later upload is a DMA at the link's rate that the host only
  issues: one for each run of adjacent cuts a layer's prefill window asks for, where a cut
  is ~1 MB and a 35B-A3B layer's window ~434 cuts. Beside the bytes it keeps how the
  expert's weights were built from them (``Rebuild``), so preparing the expert again plans
  nothing (the weight's row plan, its cut, its planes: most of a prepare's host time);
* ``Prefetch``: while a layer computes, the next MoE layer's streamed experts are prepared
  on a second stream (uploaded and tile packed there); the main stream waits for that work
  only when the next layer prepares those experts (``settle``).

Stream order: a prefetch begins after everything the main stream was given before it (its
stream waits on the main stream's event), so device memory the main stream freed is never
overwritten under a kernel still reading it; the main stream waits on the prefetch's event
before anything reads what it made.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .formats import Planes
from .weight_kinds import PackedWeight, Segment

__all__ = ["PinnedCuts", "Prefetch", "Rebuild"]


@dataclass(frozen=True)
class Rebuild:
    """How a prepare's weights were built from kept cuts: each cut by key with its planes,
    each weight its shape and segments (an index into ``cuts``, the first row, the rows)."""

    cuts: tuple[tuple[str, Planes], ...]
    weights: tuple[tuple[str, tuple[int, int], tuple[tuple[int, int, int], ...]], ...]

    @classmethod
    def of(cls, made: Mapping[str, Any], kept: Container[str]) -> Rebuild | None:
        """The rebuild of ``made`` (name -> weight), or None unless every weight is a
        ``PackedWeight`` (columns in stored order) on cuts whose bytes are in ``kept``."""
        cuts: dict[str, int] = {}
        order: list[tuple[str, Planes]] = []
        weights = []
        for name, w in made.items():
            if not isinstance(w, PackedWeight) or w.input_columns is not None:
                return None
            segments = []
            for seg in w.segments:
                key = seg.parent.object_id
                if key not in kept:
                    return None
                if key not in cuts:
                    cuts[key] = len(order)
                    order.append((key, seg.parent.planes))
                segments.append((cuts[key], seg.row0, seg.rows))
            weights.append((name, w.shape, tuple(segments)))
        return cls(tuple(order), tuple(weights))

    def weights_on(self, parents: Sequence[Any]) -> dict[str, PackedWeight]:
        """The weights on ``parents``, one a cut in ``cuts``' order."""
        return {
            name: PackedWeight([Segment(parents[i], row0, rows) for i, row0, rows in segs], shape)
            for name, shape, segs in self.weights
        }


#: bytes of one pinned block that kept cuts are laid out in, one after another (pinning is
#: costly a call, and cuts side by side in it upload in one copy)
SLAB_BYTES = 256 << 20
#: each kept cut starts at a multiple of this many bytes, in its block as on the device
ALIGN = 256


def aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


class PinnedCuts:
    """Stored bytes of cut row windows, by cut key, in host memory from ``empty`` (pinned on
    the GPU), up to ``capacity`` bytes; windows past it are not kept. The cuts are laid out
    in blocks of ``SLAB_BYTES`` in the order they are kept, each at an ``ALIGN`` multiple, so
    the cuts a prefill window keeps together lie side by side (``runs``). Beside them, by the
    prepared names, the ``Rebuild`` of each prepare whose cuts are all kept."""

    def __init__(self, capacity: int, empty: Callable[[int], np.ndarray]):
        self.capacity, self.empty = capacity, empty
        self.used = 0
        #: key -> (block, offset, size)
        self._kept: dict[str, tuple[int, int, int]] = {}
        self._blocks: list[np.ndarray] = []
        self._end = 0  # the last block's first free byte
        self.rebuilds: dict[tuple[str, ...], Rebuild] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: str) -> np.ndarray | None:
        place = self._kept.get(key)
        if place is None:
            return None
        block, offset, size = place
        return self._blocks[block][offset : offset + size]

    def keep(self, key: str, data: Any, pin: bool = False) -> np.ndarray:
        """``data`` (bytes, or a uint8 array) as the array to upload from: a kept copy while
        the allowance lasts; ``pin``: kept whatever the allowance (bytes the device reads in
        place, ``mapped_weights``, which a prefill window then uploads from as well)."""
        host = np.frombuffer(data, dtype=np.uint8)
        size = aligned(host.size)
        if not pin and self.used + size > self.capacity:
            return host
        if not self._blocks or self._end + size > self._blocks[-1].size:
            room = SLAB_BYTES if pin else min(SLAB_BYTES, self.capacity - self.used)
            self._blocks.append(self.empty(max(size, room)))
            self._end = 0
        block, offset = len(self._blocks) - 1, self._end
        self._blocks[block][offset : offset + host.size] = host
        self._kept[key] = (block, offset, host.size)
        self._end += size
        self.used += size
        return self._blocks[block][offset : offset + host.size]

    def runs(self, keys: Sequence[str]) -> list[tuple[np.ndarray, list[tuple[str, int]]]]:
        """Kept ``keys`` gathered into runs that lie side by side in one block, in block
        order: each run's host bytes (its cuts and the alignment between them) and its cuts
        with their offsets in it; a device buffer laid out alike takes a run in one copy."""
        places = sorted((self._kept[k], k) for k in keys)
        out: list[tuple[np.ndarray, list[tuple[str, int]]]] = []
        start = end = -1
        block = -1
        cuts: list[tuple[str, int]] = []
        for (b, offset, size), key in places:
            if b != block or offset != aligned(end):
                if cuts:
                    out.append((self._blocks[block][start:end], cuts))
                block, start, cuts = b, offset, []
            cuts.append((key, offset - start))
            end = offset + size
        if cuts:
            out.append((self._blocks[block][start:end], cuts))
        return out

    def learn(self, names: Sequence[str], made: Mapping[str, Any]) -> None:
        """Keep how ``made`` was prepared for ``names``, where every cut it reads is kept."""
        rebuild = Rebuild.of(made, self._kept)
        if rebuild is not None:
            self.rebuilds[tuple(names)] = rebuild


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
