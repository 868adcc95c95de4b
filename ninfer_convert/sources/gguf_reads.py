"""Positioned reads of GGUF tensor bytes into a caller's buffer, without the memory map.

A recipe that keeps blocks copies them with ``os.preadv`` straight into its buffer, so a
multi-gigabyte copy is a few hundred large sequential reads rather than page faults. Each
part is opened again by name on its first read, so it is checked to be the file that was
mapped: a file that shrank or was replaced after it was opened is caught here, in one line.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from pathlib import Path

from ..errors import SourceError


def _close_all(descriptors: dict[int, int]) -> None:
    for fd in descriptors.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    descriptors.clear()


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino


class PartReads:
    """Positioned reads from the parts of one GGUF, each opened on its first read."""

    def __init__(self, paths: list[Path]) -> None:
        self._paths = paths
        #: (device, inode) of each part as mapped: ``read_into`` opens the path again later,
        #: and a file replaced under the same name in between must not be read in its place
        self._identities = [_identity(os.stat(path)) for path in paths]
        #: part index -> file descriptor, opened on the first ``read_into`` of that part
        self._descriptors: dict[int, int] = {}
        weakref.finalize(self, _close_all, self._descriptors)

    def _descriptor(self, part: int) -> int:
        fd = self._descriptors.get(part)
        if fd is not None:
            return fd
        path = self._paths[part]
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise SourceError(f"{path}: cannot open: {exc.strerror}") from None
        if _identity(os.fstat(fd)) != self._identities[part]:
            os.close(fd)
            raise SourceError(
                f"{path}: replaced by another file since it was opened; convert again"
            )
        self._descriptors[part] = fd
        if hasattr(os, "posix_fadvise"):  # a larger read-ahead window; only a hint
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return fd

    def read_into(self, part: int, offset: int, view: memoryview) -> None:
        """Fill ``view`` with the bytes of part ``part`` from ``offset``; a file that ends
        early is a one-line ``SourceError``."""
        fd = self._descriptor(part)
        path = self._paths[part]
        done, wanted = 0, view.nbytes
        while done < wanted:
            try:
                got = os.preadv(fd, [view[done:]], offset + done)
            except OSError as exc:
                raise SourceError(
                    f"{path}: cannot read at byte {offset + done}: {exc.strerror}"
                ) from None
            if got == 0:
                raise SourceError(
                    f"{path}: ends at byte {offset + done}, but tensor data runs to byte "
                    f"{offset + wanted} (the file was cut or replaced after it was opened)"
                )
            done += got
