"""Kept ggml blocks streamed from a GGUF file into an artifact object at disk speed.

A ``gguf_import`` parent is whole rows of one or more GGUF tensors, stored verbatim. Its bytes
go from the file to the writer through one reusable buffer: adjacent row ranges are merged into
extents, each extent is read by large positioned reads straight into the buffer
(``GgufSource.read_into``), and a full buffer is handed to the writer, which hashes and writes
it. Nothing is decoded and no Python code runs per block or per row.

The decoded object equals the decoded source rows by construction (the same bytes through the
same decoder), so a member's error is zero; except where a block scale is NaN or Inf, which
decoding turns into NaN values. The codec's scan (a few strided reads of each buffer) finds
those, and the conversion report says NaN for such a member, as a decode of it would.

The buffer holds a whole number of blocks and every extent is whole rows, so each piece read
into it starts at a block boundary and is scanned on its own.
"""

from __future__ import annotations

from collections.abc import Callable
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


class BlockCopier:
    """Copies parents of kept blocks through one buffer of about ``chunk_bytes``."""

    def __init__(self, chunk_bytes: int | None = None) -> None:
        self.chunk_bytes = COPY_BYTES if chunk_bytes is None else chunk_bytes
        self._buffer = bytearray()

    def _view(self, capacity: int) -> memoryview:
        if len(self._buffer) < capacity:
            self._buffer = bytearray(capacity)
        return memoryview(self._buffer)[:capacity]

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
        buffer = self._view(max(block, self.chunk_bytes // block * block))
        note = ", ".join(m.name for m in parent.members)
        non_finite = [False] * len(parent.stacked)
        fill = 0
        for extent in extents(source, parent):
            done = 0
            while done < extent.nbytes:
                n = min(buffer.nbytes - fill, extent.nbytes - done)
                piece = buffer[fill : fill + n]
                source.read_into(extent.part, extent.offset + done, piece)
                if not non_finite[extent.member]:
                    blocks = np.frombuffer(piece, np.uint8)
                    non_finite[extent.member] = bool(codec.scan(blocks, (n // block, values)))
                fill += n
                done += n
                if fill == buffer.nbytes:
                    write(buffer)
                    advance(fill, note)
                    fill = 0
        if fill:
            write(buffer[:fill])
            advance(fill, note)
        return non_finite
