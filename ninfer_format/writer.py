"""Writing a v3 file set: plan first, stream bytes, publish atomically.

The whole directory is fixed before the first payload byte (see ``write_plan``). Objects are
then streamed in directory order, each exactly once, into locked temporary files next to the
target; checksums are patched into the reserved JSON at the end, and the files replace the
old artifact in one rename (see ``staging``). A failure before that rename, Ctrl-C included,
removes every new file and puts a moved sidecar back; what a killed writer leaves behind, the
next writer of the same target removes.
"""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from .errors import TargetExists, WriteError
from .fileset import create_locked, name_limit, remove_stale_temps, temp_name
from .framing import (
    DEFAULT_SHARD_LIMIT,
    HEADER_BYTES,
    PART_PAYLOAD_START,
    EntryHeader,
    pack_part_header,
)
from .jsontext import dump_directory_text
from .schema import Directory
from .staging import StagedFile, StagedFiles
from .validate import parse_directory
from .write_plan import (
    ResourceSpec,
    TensorSpec,
    place_objects,
    plan_files,
    planned_document,
)

# The specs and the placement live in ``write_plan``; callers import them from here too.
__all__ = [
    "ArtifactWriter",
    "ResourceSpec",
    "TensorSpec",
    "place_objects",
]


@dataclass
class _Progress:
    index: int = 0  # next object to receive bytes
    filled: int = 0  # bytes already written of that object
    hasher: Any = field(default_factory=xxhash.xxh3_64)


class ArtifactWriter:
    """Streams one artifact; use as a context manager so failures clean up.

    >>> with ArtifactWriter(path, components=..., objects=specs, bindings=..., uses=...) as w:
    ...     for spec in specs:
    ...         w.write(spec.id, encoded_bytes_of(spec))

    Every ``WriteError`` it raises starts with the target path; operating-system failures
    (no space, read-only or failing disk) are ``WriteError`` too, and leave the target as it was.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        components: dict[str, Any],
        objects: Sequence[TensorSpec | ResourceSpec],
        bindings: dict[str, Any],
        uses: Iterable[dict[str, Any]] = (),
        metadata: dict[str, Any] | None = None,
        provenance: dict[str, Any] | None = None,
        shard_limit: int = DEFAULT_SHARD_LIMIT,
        overwrite: bool = False,
        artifact_id: bytes | None = None,
    ):
        self.path = Path(path)
        self.overwrite = overwrite
        self.artifact_id = artifact_id or uuid.uuid4().bytes
        self._staged = StagedFiles(self.path)
        self._closed = False
        if len(self.artifact_id) != 16:
            raise WriteError(f"{self.path}: artifact_id must be 16 bytes")
        if shard_limit < 0:
            raise WriteError(f"{self.path}: shard limit must be >= 0, got {shard_limit}")
        if not self.path.parent.is_dir():
            raise WriteError(f"{self.path.parent}: output directory does not exist")
        self._refuse_existing()

        try:
            records = place_objects(objects)
        except WriteError as exc:
            raise WriteError(f"{self.path}: {exc}") from None
        payload = records[-1]["offset"] + records[-1]["bytes"] if records else 0
        document = planned_document(
            records,
            components=components,
            bindings=bindings,
            uses=uses,
            metadata=metadata,
            provenance=provenance,
            artifact_id=self.artifact_id,
        )
        self.directory, self._json = plan_files(self.path, document, payload, shard_limit)
        self._records = records
        self._token = secrets.token_hex(4)
        self._check_name_lengths([self.path.name, *(f.path for f in self.files[1:])])
        self._progress = _Progress()
        self._checksums: dict[str, str] = {}
        self._cursor = 0  # logical payload bytes written so far
        with self._cleaning_up():
            remove_stale_temps(self.path.parent, self.path.name)
            self._open_targets()

    # ------------------------------------------------------------------- checks
    def _refuse_existing(self) -> None:
        if not self.overwrite and os.path.lexists(self.path):
            raise TargetExists(self.path)

    def _check_name_lengths(self, names: Iterable[str]) -> None:
        limit = name_limit(self.path.parent)
        for name in names:
            size = len(os.fsencode(temp_name(name, self._token)))
            if size > limit:
                raise WriteError(
                    f"{self.path}: file name {name!r} is too long: its temporary name takes "
                    f"{size} bytes, the file system allows {limit}"
                )

    @property
    def files(self) -> list[Any]:
        return self.directory.files

    # ------------------------------------------------------------------ writing
    def _create(self, final_name: str) -> StagedFile:
        final = self.path.with_name(final_name)
        temp = self.path.with_name(temp_name(final_name, self._token))
        aside = self.path.with_name(temp_name(f"{final_name}.old", self._token))
        return StagedFile(final, temp, create_locked(temp), aside)

    def _open_targets(self) -> None:
        names = [self.path.name, *(f.path for f in self.files[1:])]
        for i, name in enumerate(names):
            target = self._create(name)
            self._staged.targets.append(target)
            if i == 0:
                target.handle.write(EntryHeader(len(self._json), self.artifact_id).pack())
                target.handle.write(self._json)
            else:
                target.handle.write(pack_part_header(i, self.artifact_id))
                target.handle.write(bytes(PART_PAYLOAD_START - HEADER_BYTES))

    def _emit(self, data: memoryview) -> None:
        """Append logical payload bytes, splitting them across files."""
        while data.nbytes:
            index, start = self._file_at(self._cursor)
            room = start + self.files[index].payload_bytes - self._cursor
            chunk = data[:room]
            target = self._staged.targets[index]
            target.handle.write(chunk)
            target.written += chunk.nbytes
            self._cursor += chunk.nbytes
            data = data[chunk.nbytes :]

    def _file_at(self, offset: int) -> tuple[int, int]:
        start = 0
        for i, f in enumerate(self.files):
            if offset < start + f.payload_bytes:
                return i, start
            start += f.payload_bytes
        raise WriteError(f"{self.path}: write past the end of the planned payload")

    def write(self, object_id: str, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Append bytes of the next object in directory order (several calls may fill one)."""
        if self._closed:
            raise WriteError(f"{self.path}: writer is closed")
        progress = self._progress
        if progress.index >= len(self._records):
            raise WriteError(
                f"{self.path}: object {object_id!r}: every planned object is already written"
            )
        record = self._records[progress.index]
        if record["id"] != object_id:
            raise WriteError(
                f"{self.path}: object {object_id!r} written out of order: the next object is "
                f"{record['id']!r}"
            )
        view = memoryview(np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data)
        view = view.cast("B")
        if progress.filled + view.nbytes > record["bytes"]:
            raise WriteError(
                f"{self.path}: object {object_id!r}: {progress.filled + view.nbytes} bytes "
                f"given, the object holds {record['bytes']}"
            )
        with self._cleaning_up():
            if progress.filled == 0 and self._cursor < record["offset"]:
                self._emit(memoryview(bytes(record["offset"] - self._cursor)))
            self._emit(view)
        progress.hasher.update(view)
        progress.filled += view.nbytes
        if progress.filled == record["bytes"]:
            self._checksums[object_id] = progress.hasher.hexdigest()
            self._progress = _Progress(progress.index + 1)

    def add_sidecar(self, suffix: str, data: bytes) -> None:
        """Publish ``data`` as ``<entry><suffix>`` together with the artifact (e.g. a conversion
        report). The old one is moved aside before the entry is swapped and the new one renamed
        in after, so the file beside an entry never describes another artifact: a failure puts
        the old one back; a kill in the instant around the swap can only leave none.
        """
        if self._closed:
            raise WriteError(f"{self.path}: writer is closed")
        if not suffix.startswith(".") or "/" in suffix or "\\" in suffix:
            raise WriteError(f"{self.path}: sidecar suffix {suffix!r} must be like '.report.json'")
        name = self.path.name + suffix
        self._check_name_lengths([f"{name}.old"])  # the longest name it goes by
        with self._cleaning_up():
            sidecar = self._create(name)
            self._staged.sidecars.append(sidecar)
            sidecar.handle.write(data)

    # --------------------------------------------------------------- finishing
    def close(self) -> Directory:
        """Check completeness, patch checksums, publish (parts, entry, sidecars)."""
        if self._closed:
            return self.directory
        with self._cleaning_up():
            missing = [r["id"] for r in self._records[self._progress.index :]]
            if missing:
                raise WriteError(
                    f"{self.path}: {len(missing)} planned objects were not written "
                    f"(first: {missing[0]!r})"
                )
            self._patch_checksums()
            for target, f in zip(self._staged.targets, self.files, strict=True):
                if target.written != f.payload_bytes:
                    raise WriteError(f"{self.path}: {target.final.name}: payload size mismatch")
            self._staged.seal()
            self._refuse_existing()
            self._staged.publish({f.path for f in self.files[1:]})
        self._staged.release()
        self._closed = True
        return self.directory

    def _patch_checksums(self) -> None:
        document = self.directory.to_document()
        document["provenance"]["checksums"] = self._checksums
        directory = parse_directory(document)
        text = dump_directory_text(directory.to_document())
        if len(text) > len(self._json):
            raise WriteError("checksums changed the directory length")  # cannot happen: fixed width
        entry = self._staged.targets[0].handle
        entry.seek(HEADER_BYTES)
        entry.write(text + b" " * (len(self._json) - len(text)))
        entry.seek(0, os.SEEK_END)
        self.directory = directory

    @contextmanager
    def _cleaning_up(self) -> Iterator[None]:
        """Any failure aborts; an operating-system error becomes a one-line ``WriteError``."""
        try:
            yield
        except OSError as exc:
            error = self._os_error(exc)
            self.abort()
            raise error from None
        except BaseException:
            self.abort()
            raise

    def _os_error(self, exc: OSError) -> WriteError:
        reason = exc.strerror or str(exc)
        if exc.filename:
            reason = f"{Path(exc.filename).name}: {reason}"
        if self._staged.published():
            return WriteError(f"{self.path}: published, but a sidecar failed: {reason}")
        return WriteError(f"{self.path}: cannot write ({reason}); the target is unchanged")

    def abort(self) -> None:
        """Remove every file not published; nothing of a failed run stays visible."""
        self._closed = True
        self._staged.discard()

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
