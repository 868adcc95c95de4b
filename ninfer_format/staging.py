"""The files of an artifact being written, and how they replace the old one in one step.

Each file is written as a locked temporary file next to the target (see ``fileset``).
Publishing replaces the artifact in one step, the rename of the entry file. The continuation
files are renamed first, to names no file has (the spec's ``<entry>.part-0001`` where free,
else with a generation suffix), so the old artifact stays whole until its entry is replaced;
the parts only the old artifact used are deleted after. Sidecar files (a conversion report)
are moved aside before that rename and renamed in after it, so a sidecar never describes
another artifact. Discarding before the entry rename removes every new file and puts a moved
sidecar back.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from .fileset import remove_unused_parts


@dataclass
class StagedFile:
    """One file being written: its final path, its locked temporary file, its progress."""

    final: Path
    temp: Path
    handle: BinaryIO
    aside: Path  # where a sidecar's predecessor waits for the swap (a stale temp, should we die)
    written: int = 0  # payload bytes (entry and parts)
    moved: bool = False
    predecessor_aside: bool = False

    @property
    def location(self) -> Path:
        return self.final if self.moved else self.temp

    def seal(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def move(self) -> None:
        os.replace(self.temp, self.final)
        self.moved = True

    def set_aside(self) -> None:
        """Move the file this one replaces out of the way; a failure before the swap restores
        it, a success deletes it."""
        try:
            os.replace(self.final, self.aside)
        except FileNotFoundError:
            return
        self.predecessor_aside = True

    def settle_aside(self, *, published: bool) -> None:
        if self.predecessor_aside:
            if published:
                self.aside.unlink(missing_ok=True)
            else:
                os.replace(self.aside, self.final)
            self.predecessor_aside = False


@dataclass
class StagedFiles:
    """The entry, its parts and its sidecars of one artifact at ``path``, until published."""

    path: Path
    targets: list[StagedFile] = field(default_factory=list)  # the entry, then the parts
    sidecars: list[StagedFile] = field(default_factory=list)

    @property
    def every_file(self) -> list[StagedFile]:
        return [*self.targets, *self.sidecars]

    def seal(self) -> None:
        """Every byte durable before any rename makes it visible."""
        for f in self.every_file:
            f.seal()

    def publish(self, used_parts: Collection[str]) -> None:
        """Parts, then the entry (the one step that replaces the artifact), then sidecars;
        ``used_parts`` are the part names the new entry lists."""
        entry, *parts = self.targets
        for part in parts:
            part.move()  # to a name no file had: the old artifact is untouched
        fsync_dir(self.path.parent)  # parts durable before the entry refers to them
        for sidecar in self.sidecars:
            sidecar.set_aside()
        entry.move()  # the one step that replaces the artifact
        try:
            for sidecar in self.sidecars:
                sidecar.move()
            fsync_dir(self.path.parent)
        finally:
            self._remove_replaced(used_parts)

    def _remove_replaced(self, used_parts: Collection[str]) -> None:
        """After the swap, whatever else happens: delete what only the old artifact used."""
        for sidecar in self.sidecars:
            with suppress(OSError):
                sidecar.settle_aside(published=True)
        if self.published():  # another writer of this target may have swapped in since
            remove_unused_parts(self.path.parent, self.path.name, used_parts)

    def published(self) -> bool:
        """Whether the file at the target path is the entry staged here."""
        if not self.targets:
            return False
        try:
            mine = os.fstat(self.targets[0].handle.fileno())
            return os.path.samestat(mine, os.stat(self.path))
        except (OSError, ValueError):  # ValueError: the handle is closed
            return False

    def discard(self) -> None:
        """Remove every file not published and put a moved sidecar back (unless published)."""
        published = self.published()
        for f in self.every_file:
            with suppress(OSError):
                if not (published and f.moved):
                    f.location.unlink(missing_ok=True)
                f.settle_aside(published=published)
        self.release()

    def release(self) -> None:
        """Close every handle, which also drops the locks."""
        for f in self.every_file:
            with suppress(OSError):
                f.handle.close()


def fsync_dir(directory: Path) -> None:
    """Make renames in ``directory`` durable, where the file system allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
