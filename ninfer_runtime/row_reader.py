"""Reading a few rows of a stored ``[N, K]`` object straight from the artifact's files.

A hashed n-gram table can be far larger than memory (Qwen4Exp's PLE: ~45 B parameters), while
a step needs a few rows of it. ``RowReader`` reads only the byte ranges of the rows asked for
(``os.preadv`` on its own descriptors, advised random access so the kernel reads no more
around them), one range per run of adjacent rows and plane, and decodes the gathered rows
with the object's codec: the values are exactly those of decoding the whole object.

Ranges the page cache holds are copied by the calling thread, asked not to wait for the disk
(``RWF_NOWAIT``): threads would only contend for the interpreter's lock between copies of a
few microseconds (255 cached ranges took 2.6 ms from a pool of threads and 0.8 ms from one,
docs/performance.md). The ranges that would wait for the disk are read after, a large batch
of them from several threads at once so the disk's queue stays full.

``RowCounters`` count what was read: bytes (of the ranges, as stored: NF4 rows count their
codes and scales), rows and ranges.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer_format.codecs.row_planes import row_planes, rows_object
from ninfer_format.schema import Tensor, WholeBinding

from .errors import ModelError

#: a read of at least this many ranges from the disk is spread over ``READ_THREADS`` threads
PARALLEL_RANGES = 64
READ_THREADS = 16
#: ``preadv``'s flag for "only what the page cache holds" (Linux 4.14+; 0: not offered here)
NOWAIT = getattr(os, "RWF_NOWAIT", 0)


@dataclass
class RowCounters:
    """What a reader has read from disk since it was made (or last ``reset``)."""

    bytes: int = 0
    rows: int = 0
    ranges: int = 0

    def reset(self) -> None:
        self.bytes = self.rows = self.ranges = 0


class RowReader:
    """The rows of parameter ``name`` (a whole binding of a row-ordered tensor object)."""

    def __init__(self, artifact: Any, name: str):
        binding = artifact.bindings.get(name)
        if not isinstance(binding, WholeBinding):
            raise ModelError(f"parameter {name!r}: rows are read from one whole object only")
        obj = artifact.object(binding.object)
        if not isinstance(obj, Tensor):
            raise ModelError(f"parameter {name!r}: object {obj.id!r} is not a tensor")
        shape = tuple(obj.shape)
        planes = row_planes(obj.format, obj.layout, shape, obj.divisors)
        if planes is None:
            raise ModelError(
                f"parameter {name!r}: {obj.format}/{obj.layout} of shape {list(shape)} cannot "
                "be read by rows"
            )
        self.name, self.artifact, self.object = name, artifact, obj
        self.shape: tuple[int, int] = (shape[0], shape[1])
        self.codec = artifact.codec(obj.id)  # the object's size and alignment checked first
        self.planes = planes
        #: per plane, (file index, file offset of its row 0) when all its rows lie in one
        #: file of the set (a read's ranges then need no lookup), else None
        self._plane_files = [self._in_one_file(obj.offset + p.offset, p, shape[0]) for p in planes]
        self.counters = RowCounters()
        self._files: dict[int, int] = {}
        self._opening = threading.Lock()
        #: whether reads may ask for cached bytes only (off once the file system refuses)
        self._nowait = bool(NOWAIT)
        weakref.finalize(self, _close_all, self._files)

    @property
    def stored_row_bytes(self) -> int:
        """Bytes one row takes on disk, over all planes."""
        return sum(p.row_bytes for p in self.planes)

    def read(self, rows: np.ndarray) -> np.ndarray:
        """Values float32 ``[len(rows), K]`` of ``rows``: ascending, distinct row indices."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size == 0:
            return np.zeros((0, self.shape[1]), np.float32)
        if rows[0] < 0 or rows[-1] >= self.shape[0] or np.any(np.diff(rows) <= 0):
            last = self.shape[0] - 1
            raise ModelError(
                f"parameter {self.name!r}: rows must be distinct and ascending in 0..{last}"
            )
        # runs of adjacent rows: (first row, count, where the run starts in the gathered rows)
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        starts = np.concatenate([[0], breaks])
        counts = np.diff(np.concatenate([starts, [rows.size]]))
        runs = list(zip(rows[starts].tolist(), counts.tolist(), starts.tolist(), strict=True))
        gathered, ranges = [], []
        for plane, in_file in zip(self.planes, self._plane_files, strict=True):
            size = plane.row_bytes
            buffer = memoryview(np.empty(rows.size * size, dtype=np.uint8))
            for first, count, at in runs:
                out = buffer[at * size : (at + count) * size]
                if in_file is not None:  # the whole plane in one file: its offset by sum
                    ranges.append((out, in_file[0], in_file[1] + first * size))
                    continue
                offset = self.object.offset + plane.offset + first * size
                for index, at_file, dest, length in self.artifact.segments(offset, len(out)):
                    ranges.append((out[dest : dest + length], index, at_file))
            gathered.append(np.frombuffer(buffer, dtype=np.uint8))
        self._read_ranges(ranges)
        self.counters.bytes += sum(b.size for b in gathered)
        self.counters.rows += rows.size
        self.counters.ranges += len(runs) * len(self.planes)
        obj = self.object
        data = rows_object(obj.format, obj.layout, self.shape[1], gathered, rows.size)
        return self.codec.decode(data, (rows.size, self.shape[1]))

    def _in_one_file(self, offset: int, plane: Any, rows: int) -> tuple[int, int] | None:
        """(file index, file offset) of a plane's first byte at logical ``offset`` when its
        ``rows`` rows lie in one file of the set, else None."""
        segments = self.artifact.segments(offset, rows * plane.row_bytes)
        return (segments[0][0], segments[0][1]) if len(segments) == 1 else None

    def _read_ranges(self, ranges: list[tuple[memoryview, int, int]]) -> None:
        """Each ``(out, file index, file offset)`` read: what the page cache holds here, the
        rest after it, many at once from threads (``preadv`` releases the GIL), so a
        prefill's scattered rows keep the disk's queue full rather than one deep."""
        if self._nowait:
            ranges = self._read_cached(ranges)
        if len(ranges) < PARALLEL_RANGES:
            for r in ranges:
                self._read_into(*r)
            return
        share = -(-len(ranges) // READ_THREADS)
        parts = [ranges[i : i + share] for i in range(0, len(ranges), share)]
        for _ in _readers().map(lambda part: [self._read_into(*r) for r in part], parts):
            pass

    def _read_cached(
        self, ranges: list[tuple[memoryview, int, int]]
    ) -> list[tuple[memoryview, int, int]]:
        """The ranges the page cache held whole read into their ``out``; the others returned
        (some of each would wait for the disk: read again whole after). One tight loop: a
        decode step's hundreds of ranges are a few microseconds each, most of it this loop."""
        left, fds = [], {}
        for k, (out, index, at) in enumerate(ranges):
            fd = fds.get(index)
            if fd is None:
                fd = fds[index] = self._file(index)
            try:
                if os.preadv(fd, [out], at, NOWAIT) == len(out):
                    continue
            except BlockingIOError:
                pass
            except OSError:  # a file system that does not offer it: the rest as before
                self._nowait = False
                return left + ranges[k:]
            left.append((out, index, at))
        return left

    def _read_into(self, out: memoryview, index: int, at: int) -> None:
        """``len(out)`` bytes of file ``index`` at file offset ``at`` into ``out``."""
        while len(out):
            got = os.preadv(self._file(index), [out], at)
            if got <= 0:
                path = self.artifact.files[index].path
                raise ModelError(f"{path}: ends inside parameter {self.name!r}")
            out, at = out[got:], at + got

    def _file(self, index: int) -> int:
        fd = self._files.get(index)
        if fd is not None:
            return fd
        with self._opening:
            fd = self._files.get(index)
            if fd is None:
                self.artifact.read_file(index, 0, 0)  # the artifact checks the file (R15) first
                fd = os.open(self.artifact.files[index].path, os.O_RDONLY)
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                self._files[index] = fd
        return fd

    def close(self) -> None:
        _close_all(self._files)


@functools.cache
def _readers() -> ThreadPoolExecutor:
    """The threads every reader's large batches of ranges share."""
    return ThreadPoolExecutor(READ_THREADS, thread_name_prefix="row-reader")


def _close_all(files: dict[int, int]) -> None:
    for fd in files.values():
        os.close(fd)
    files.clear()
