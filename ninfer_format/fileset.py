"""An artifact's files on disk: temporary files, who holds them, and what is stale.

The writer creates every file as a hidden temporary file ``.<final name>.tmp-<8 hex digits>``
and holds an exclusive ``flock`` on it until it has finished. The kernel drops the lock when its
process ends, however it ends, so a later writer of the same target can tell a stale file (no
lock: its writer was killed) from one a live writer is still producing (locked), without
trusting process ids or clocks.

Stale files of a target ``m.ninfer`` are its temporary files, and its continuation files
(``m.ninfer.part-0001``, or ``m.ninfer.part-0001.<generation>`` after a replacement) that the
current entry does not list: the parts of a replaced artifact, or of a run killed between
renaming its parts and its entry.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import BinaryIO

from .framing import PART_MAGIC

#: file-name limit in bytes where the file system does not say (ext4, xfs, btrfs, APFS)
NAME_MAX = 255


def name_limit(directory: Path) -> int:
    """The longest file name, in bytes, that ``directory``'s file system accepts."""
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return NAME_MAX


def temp_name(final_name: str, token: str) -> str:
    return f".{final_name}.tmp-{token}"


def create_locked(path: Path) -> BinaryIO:
    """A new file at ``path``, exclusively locked for as long as the handle stays open."""
    handle = path.open("xb")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        # A cleanup that locked the file in the instant before us has deleted it: fail rather
        # than write into a file no name leads to.
        os.stat(path)
    except BaseException:
        handle.close()
        raise
    return handle


def remove_stale_temps(directory: Path, entry_name: str) -> None:
    """Delete the temporary files of ``entry_name`` that no live writer holds."""
    pattern = re.compile(rf"\.{re.escape(entry_name)}(\..+)?\.tmp-[0-9a-f]{{8}}")
    for path in _matching(directory, pattern):
        _remove_unlocked(path)


def remove_unused_parts(directory: Path, entry_name: str, used: Collection[str]) -> None:
    """Delete the continuation files named after ``entry_name`` that are not in ``used`` (the
    current entry's file table), that no live writer holds and that are part files indeed."""
    pattern = re.compile(rf"{re.escape(entry_name)}\.part-\d{{4,}}(\.[0-9a-f]{{8}})?")
    for path in _matching(directory, pattern):
        if path.name not in used:
            _remove_unlocked(path, magic=PART_MAGIC)


def _matching(directory: Path, pattern: re.Pattern[str]) -> Iterator[Path]:
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if pattern.fullmatch(name):
            yield directory / name


def _remove_unlocked(path: Path, magic: bytes = b"") -> None:
    """Unlink ``path`` if it is a regular file starting with ``magic`` that nobody holds.

    Best effort: a file that cannot be examined or removed is left for a later run."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a live writer's file
        info = os.fstat(fd)
        if (
            stat.S_ISREG(info.st_mode)
            and os.pread(fd, len(magic), 0) == magic
            and os.path.samestat(info, os.lstat(path))
        ):
            os.unlink(path)
    except OSError:
        pass
    finally:
        os.close(fd)
