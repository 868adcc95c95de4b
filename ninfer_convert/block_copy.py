"""Kept ggml blocks streamed from a GGUF file into an artifact object at disk speed.

A ``gguf_import`` parent is whole rows of one or more GGUF tensors, stored verbatim. Its bytes
go from the file to the writer through two reusable buffers: adjacent row ranges are merged into
extents, extents are read by large positioned reads straight into a buffer
(``GgufSource.read_into``), and a full buffer is handed to the writer, which hashes and writes
it while the other buffer is being read. Nothing is decoded and no Python code runs per block
or per row.

The decoded object equals the decoded source rows by construction (the same bytes through the
same decoder), so a member's error is zero; except where a block scale is NaN or Inf, which
decoding turns into NaN values. The codec's scan (a few strided reads of each buffer) finds
those, and the conversion report says NaN for such a member, as a decode of it would.

A buffer holds a whole number of blocks and every extent is whole rows, so each piece read
into it starts at a block boundary and is scanned on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from ninfer_format.codecs import codec_for
from ninfer_format.progress import Advance

from .errors import RecipeError
from .plan import Parent
from .sources import GgufSource

#: bytes per read and per write: large enough that system calls and hashing calls cost nothing
#: next to the bytes, small enough to stay in the CPU's last-level cache for the hash
COPY_BYTES = 16 << 20


@dataclass(frozen=True)
class Extent:
    """A run of stored bytes of one stacked member: ``nbytes`` from ``offset`` of ``part``."""

    member: int
    part: int
    offset: int
    nbytes: int


def extents(source: GgufSource, parent: Parent) -> list[Extent]:
    """The parent's bytes as file ranges, in object order (adjacent rows of a member merged)."""
    out: list[Extent] = []
    for index, member in enumerate(parent.stacked):
        for piece in member.pieces:
            if piece.rows is None:
                raise RecipeError(f"{member.name}: GGUF pieces must name their rows")
            part, offset, nbytes = source.block_range(piece.tensor, *piece.rows)
            last = out[-1] if out else None
            if (
                last is not None
                and (last.member, last.part) == (index, part)
                and last.offset + last.nbytes == offset
            ):
                out[-1] = replace(last, nbytes=last.nbytes + nbytes)
            else:
                out.append(Extent(index, part, offset, nbytes))
    return out


@dataclass(frozen=True)
class Read:
    """One positioned read into a buffer: ``nbytes`` of ``part`` from ``offset`` to ``start``."""

    member: int
    part: int
    offset: int
    start: int
    nbytes: int


def fills(runs: list[Extent], capacity: int) -> list[list[Read]]:
    """The reads that fill each buffer of ``capacity`` bytes in turn (the last one partly): a
    buffer may hold the end of one extent and the start of the next."""
    out: list[list[Read]] = []
    used = capacity
    for extent in runs:
        done = 0
        while done < extent.nbytes:
            if used == capacity:
                out.append([])
                used = 0
            n = min(capacity - used, extent.nbytes - done)
            out[-1].append(Read(extent.member, extent.part, extent.offset + done, used, n))
            used += n
            done += n
    return out


class BlockCopier:
    """Copies parents of kept blocks through two buffers of about ``chunk_bytes``: a thread
    reads and scans the next buffer while the writer hashes and writes the current one (both
    release the GIL for the bytes, so the two overlap on two cores)."""

    def __init__(self, chunk_bytes: int | None = None) -> None:
        self.chunk_bytes = COPY_BYTES if chunk_bytes is None else chunk_bytes
        self._buffers: list[bytearray] = []

    def _views(self, capacity: int) -> list[memoryview]:
        if not self._buffers or len(self._buffers[0]) < capacity:
            self._buffers = [bytearray(capacity), bytearray(capacity)]
        return [memoryview(b)[:capacity] for b in self._buffers]

    def copy(
        self,
        source: GgufSource,
        parent: Parent,
        write: Callable[[memoryview], None],
        advance: Advance,
    ) -> list[bool]:
        """Stream the parent's object bytes through ``write`` (``advance`` gets each chunk's
        size); returns, per stacked member, whether one of its block scales is NaN or Inf."""
        codec = codec_for(parent.choice.format, parent.layout)
        block, values = codec.block_bytes, codec.block_values
        capacity = max(block, self.chunk_bytes // block * block)
        buffers = self._views(capacity)
        schedule = fills(extents(source, parent), capacity)
        note = ", ".join(m.name for m in parent.members)
        non_finite = [False] * len(parent.stacked)

        def fill(reads: list[Read], buffer: memoryview) -> tuple[int, set[int]]:
            """Read ``reads`` into ``buffer``: the bytes filled and the members whose blocks
            there have a NaN or Inf scale."""
            flagged = set()
            for r in reads:
                piece = buffer[r.start : r.start + r.nbytes]
                source.read_into(r.part, r.offset, piece)
                if codec.scan(np.frombuffer(piece, np.uint8), (r.nbytes // block, values)):
                    flagged.add(r.member)
            return reads[-1].start + reads[-1].nbytes, flagged

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gguf-read") as reader:
            pending = reader.submit(fill, schedule[0], buffers[0]) if schedule else None
            for i in range(len(schedule)):
                assert pending is not None
                size, flagged = pending.result()  # a read's error is raised here
                if i + 1 < len(schedule):  # the other buffer: the writer is done with it
                    pending = reader.submit(fill, schedule[i + 1], buffers[(i + 1) % 2])
                for member in flagged:
                    non_finite[member] = True
                write(buffers[i % 2][:size])
                advance(size, note)
        return non_finite
