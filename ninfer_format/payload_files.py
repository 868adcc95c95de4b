"""The files of an opened artifact as one logical payload: lazy maps, range reads.

Continuation files are opened (and R15-checked) on first need. A range of the logical payload
maps to segments of one or more files; a range that lies in one file is read as a zero-copy
view of its memory map.
"""

from __future__ import annotations

import mmap
import os
from bisect import bisect_right
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ArtifactError, FramingError, PartFileError
from .fileset import name_limit
from .framing import HEADER_BYTES, PART_PAYLOAD_START, check_part_header
from .schema import File


def _check_name_length(path: Path, index: int) -> None:
    """A part name the file system cannot hold names a file that cannot exist."""
    size, limit = len(os.fsencode(path.name)), name_limit(path.parent)
    if size > limit:
        shown = path.name if len(path.name) <= 40 else f"{path.name[:28]}...{path.name[-8:]}"
        raise PartFileError(
            f"files[{index}].path {shown!r} is {size} bytes, longer than the {limit}-byte "
            "file-name limit: that part file cannot exist"
        )


@dataclass(frozen=True)
class PayloadFile:
    """One file of the set and the slice of the logical payload it stores."""

    index: int
    path: Path
    payload_start: int  # file offset of its first payload byte
    logical_start: int  # P_i
    payload_bytes: int  # B_i

    @property
    def logical_end(self) -> int:
        return self.logical_start + self.payload_bytes

    @property
    def file_size(self) -> int:
        return self.payload_start + self.payload_bytes


class PayloadFiles:
    """The entry at ``path`` and its continuation files, mapped on first read."""

    def __init__(
        self,
        path: Path,
        entries: Sequence[File],
        artifact_id: bytes,
        entry_payload_start: int,
    ):
        self.path = path
        self.artifact_id = artifact_id
        files, start = [], 0
        for i, f in enumerate(entries):
            where = path if i == 0 else path.parent / f.path  # type: ignore[operator]
            first = entry_payload_start if i == 0 else PART_PAYLOAD_START
            files.append(PayloadFile(i, where, first, start, f.payload_bytes))
            start += f.payload_bytes
        self.files: list[PayloadFile] = files
        self.payload_bytes = start
        self._starts = [f.logical_start for f in files]
        self._maps: dict[int, mmap.mmap] = {}

    def close(self) -> None:
        for mm in self._maps.values():
            with suppress(BufferError):  # a caller still holds a zero-copy view of it
                mm.close()
        self._maps.clear()

    def _map(self, index: int) -> mmap.mmap:
        mm = self._maps.get(index)
        if mm is not None:
            return mm
        f = self.files[index]
        name = f.path.name
        _check_name_length(f.path, index)
        try:
            if f.path.exists() and not f.path.is_file():  # a FIFO would block open() forever
                raise PartFileError(f"{name}: file {index} of the set is not a regular file")
            with f.path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if index > 0:
                    check_part_header(
                        fh.read(HEADER_BYTES),
                        size,
                        name,
                        index,
                        self.artifact_id,
                        f.payload_bytes,
                    )
                elif size != f.file_size:
                    raise FramingError(f"{name}: file changed size since it was opened")
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise PartFileError(
                f"{name}: continuation file {index} is missing (expected next to {self.path.name})"
            ) from None
        except OSError as exc:
            raise PartFileError(f"{name}: cannot read: {exc.strerror}") from None
        self._maps[index] = mm
        return mm

    def segments(self, offset: int, length: int) -> list[tuple[int, int, int, int]]:
        """Map a logical range to ``(file index, file offset, destination offset, bytes)``."""
        if offset < 0 or length < 0 or offset + length > self.payload_bytes:
            raise ArtifactError(
                f"range [{offset}, {offset + length}) is outside the payload "
                f"({self.payload_bytes} bytes)"
            )
        out = []
        i = max(bisect_right(self._starts, offset) - 1, 0)
        start, end = offset, offset + length
        while offset < end:
            f = self.files[i]
            take = min(end, f.logical_end) - offset
            if take > 0:
                out.append((i, f.payload_start + offset - f.logical_start, offset - start, take))
                offset += take
            i += 1
        return out

    def read(self, offset: int, length: int) -> np.ndarray:
        """Logical payload bytes as uint8; a zero-copy view when the range lies in one file."""
        segs = self.segments(offset, length)
        if len(segs) == 1:
            i, at, _, n = segs[0]
            return self.read_file(i, at, n)
        for i, *_ in segs:
            self._map(i)  # every file checked (R15) before a buffer of that size exists
        out = np.empty(length, dtype=np.uint8)
        for i, at, dest, n in segs:
            out[dest : dest + n] = self.read_file(i, at, n)
        return out

    def read_file(self, index: int, file_offset: int, length: int) -> np.ndarray:
        """Bytes of one file of the set by file offset (headers included), as a view."""
        return np.frombuffer(self._map(index), dtype=np.uint8, count=length, offset=file_offset)
