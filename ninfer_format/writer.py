"""Writing a v3 file set: plan first, stream bytes, publish atomically.

Every object's size follows from its declaration (shape, format, layout; a resource's stored
length), so the writer fixes the whole directory before the first payload byte: placement,
sharding and the JSON reservation. Objects are then streamed in directory order, each exactly
once, into temporary files next to the target. Checksums (xxh3-64, fixed 16 hex digits) are
patched into the reserved JSON at the end, continuation files are renamed into place first and
the entry last. Any failure, including Ctrl-C, removes the temporary files.
"""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import xxhash

from .codecs import codec_for
from .errors import ArtifactError, WriteError
from .framing import (
    DEFAULT_SHARD_LIMIT,
    HEADER_BYTES,
    PAGE,
    PART_PAYLOAD_START,
    EntryHeader,
    align_up,
    pack_part_header,
    part_file_name,
    shard_sizes,
)
from .jsontext import dump_directory_text
from .schema import Directory
from .validate import check_directory, parse_directory

CHECKSUM_PLACEHOLDER = "0" * 16


@dataclass(frozen=True)
class TensorSpec:
    id: str
    shape: tuple[int, ...]
    format: str
    layout: str
    divisors: int | None = None


@dataclass(frozen=True)
class ResourceSpec:
    id: str
    encoding: str
    bytes: int


@dataclass
class _Target:
    final: Path
    temp: Path
    handle: BinaryIO
    written: int = 0


@dataclass
class _Progress:
    index: int = 0  # next object to receive bytes
    filled: int = 0  # bytes already written of that object
    hasher: Any = field(default_factory=xxhash.xxh3_64)


def place_objects(specs: Sequence[TensorSpec | ResourceSpec]) -> list[dict[str, Any]]:
    """Object records with sequential placement: resources unaligned, tensors at their alignment."""
    records, end = [], 0
    for spec in specs:
        if isinstance(spec, ResourceSpec):
            rec = {"id": spec.id, "kind": "resource", "encoding": spec.encoding}
            size, offset = spec.bytes, end
        else:
            try:
                codec = codec_for(spec.format, spec.layout)
                size = codec.encoded_size(tuple(spec.shape), spec.divisors or 1)
            except ArtifactError as exc:
                raise WriteError(f"object {spec.id!r}: {exc}") from None
            offset = align_up(end, codec.alignment)
            rec = {"id": spec.id, "kind": "tensor", "shape": list(spec.shape)}
            rec |= {"format": spec.format, "layout": spec.layout}
            if spec.divisors is not None:
                rec["divisors"] = spec.divisors
        rec |= {"offset": offset, "bytes": size}
        records.append(rec)
        end = offset + size
    return records


class ArtifactWriter:
    """Streams one artifact; use as a context manager so failures clean up.

    >>> with ArtifactWriter(path, components=..., objects=specs, bindings=..., uses=...) as w:
    ...     for spec in specs:
    ...         w.write(spec.id, encoded_bytes_of(spec))
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
        if len(self.artifact_id) != 16:
            raise WriteError("artifact_id must be 16 bytes")
        if shard_limit < 0:
            raise WriteError(f"shard limit must be >= 0, got {shard_limit}")
        if not self.path.parent.is_dir():
            raise WriteError(f"{self.path.parent}: output directory does not exist")
        self._refuse_existing([self.path])

        records = place_objects(objects)
        payload = records[-1]["offset"] + records[-1]["bytes"] if records else 0
        provenance = dict(provenance or {})
        provenance["checksums"] = {r["id"]: CHECKSUM_PLACEHOLDER for r in records}
        document = {
            "components": components,
            "objects": records,
            "bindings": bindings,
            "uses": list(uses),
            "metadata": metadata or {},
            "provenance": provenance,
        }
        self.directory, self._json = self._reserve(document, payload, shard_limit)
        self._records = records
        self._part_names = [part_file_name(self.path.name, i) for i in range(1, len(self.files))]
        self._refuse_existing([self.path.with_name(n) for n in self._part_names])
        self._progress = _Progress()
        self._checksums: dict[str, str] = {}
        self._targets: list[_Target] = []
        self._cursor = 0  # logical payload bytes written so far
        self._closed = False
        try:
            self._open_targets()
        except BaseException:
            self.abort()
            raise

    # ----------------------------------------------------------------- planning
    def _refuse_existing(self, paths: list[Path]) -> None:
        if self.overwrite:
            return
        for p in paths:
            if p.exists():
                raise WriteError(f"{p}: already exists (pass overwrite=True / --force to replace)")

    def _reserve(
        self, document: dict[str, Any], payload: int, limit: int
    ) -> tuple[Directory, bytes]:
        """The section 1.6 loop: reserve JSON space to a page boundary, then shard."""
        document = dict(document, files=[{"path": None, "payload_bytes": payload}])
        directory = self._validated(document)
        reserve = align_up(HEADER_BYTES + len(dump_directory_text(directory.to_document())), PAGE)
        reserve -= HEADER_BYTES
        while True:
            sizes = shard_sizes(HEADER_BYTES + reserve, payload, limit)
            files = [{"path": None, "payload_bytes": sizes[0]}]
            files += [
                {"path": part_file_name(self.path.name, i), "payload_bytes": n}
                for i, n in enumerate(sizes[1:], start=1)
            ]
            directory = self._validated(dict(document, files=files))
            text = dump_directory_text(directory.to_document())
            if len(text) <= reserve:
                return directory, text + b" " * (reserve - len(text))
            reserve = align_up(HEADER_BYTES + len(text), PAGE) - HEADER_BYTES

    def _validated(self, document: dict[str, Any]) -> Directory:
        try:
            directory = parse_directory(document)
            check_directory(directory, self.path.name)
        except ArtifactError as exc:
            raise WriteError(
                f"{self.path.name}: the directory to write is invalid", problems=exc.problems
            ) from None
        return directory

    @property
    def files(self) -> list[Any]:
        return self.directory.files

    # ------------------------------------------------------------------ writing
    def _open_targets(self) -> None:
        token = secrets.token_hex(4)
        names = [self.path.name, *self._part_names]
        for i, name in enumerate(names):
            final = self.path.with_name(name)
            temp = self.path.with_name(f".{name}.tmp-{token}")
            handle = temp.open("xb")
            self._targets.append(_Target(final, temp, handle))
            if i == 0:
                handle.write(EntryHeader(len(self._json), self.artifact_id).pack())
                handle.write(self._json)
            else:
                handle.write(pack_part_header(i, self.artifact_id))
                handle.write(bytes(PART_PAYLOAD_START - HEADER_BYTES))

    def _emit(self, data: memoryview) -> None:
        """Append logical payload bytes, splitting them across files."""
        while data.nbytes:
            index, start = self._file_at(self._cursor)
            room = start + self.files[index].payload_bytes - self._cursor
            chunk = data[:room]
            target = self._targets[index]
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
        raise WriteError(f"{self.path.name}: write past the end of the planned payload")

    def write(self, object_id: str, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Append bytes of the next object in directory order (several calls may fill one)."""
        if self._closed:
            raise WriteError(f"{self.path.name}: writer is closed")
        progress = self._progress
        if progress.index >= len(self._records):
            raise WriteError(f"object {object_id!r}: every planned object is already written")
        record = self._records[progress.index]
        if record["id"] != object_id:
            raise WriteError(
                f"object {object_id!r} written out of order: the next object is {record['id']!r}"
            )
        view = memoryview(np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data)
        view = view.cast("B")
        if progress.filled + view.nbytes > record["bytes"]:
            raise WriteError(
                f"object {object_id!r}: {progress.filled + view.nbytes} bytes given, "
                f"the object holds {record['bytes']}"
            )
        if progress.filled == 0 and self._cursor < record["offset"]:
            self._emit(memoryview(bytes(record["offset"] - self._cursor)))
        self._emit(view)
        progress.hasher.update(view)
        progress.filled += view.nbytes
        if progress.filled == record["bytes"]:
            self._checksums[object_id] = progress.hasher.hexdigest()
            self._progress = _Progress(progress.index + 1)

    # --------------------------------------------------------------- finishing
    def close(self) -> Directory:
        """Check completeness, patch checksums, publish parts then the entry."""
        if self._closed:
            return self.directory
        try:
            missing = [r["id"] for r in self._records[self._progress.index :]]
            if missing:
                raise WriteError(
                    f"{self.path.name}: {len(missing)} planned objects were not written "
                    f"(first: {missing[0]!r})"
                )
            self._patch_checksums()
            for target, f in zip(self._targets, self.files, strict=True):
                if target.written != f.payload_bytes:
                    raise WriteError(f"{target.final.name}: payload size mismatch")
                target.handle.flush()
                os.fsync(target.handle.fileno())
                target.handle.close()
            self._refuse_existing([t.final for t in self._targets])
            for target in [*self._targets[1:], self._targets[0]]:
                os.replace(target.temp, target.final)
            _fsync_dir(self.path.parent)
        except BaseException:
            self.abort()
            raise
        self._closed = True
        return self.directory

    def _patch_checksums(self) -> None:
        document = self.directory.to_document()
        document["provenance"]["checksums"] = self._checksums
        directory = parse_directory(document)
        text = dump_directory_text(directory.to_document())
        if len(text) > len(self._json):
            raise WriteError("checksums changed the directory length")  # cannot happen: fixed width
        entry = self._targets[0].handle
        entry.seek(HEADER_BYTES)
        entry.write(text + b" " * (len(self._json) - len(text)))
        entry.seek(0, os.SEEK_END)
        self.directory = directory

    def abort(self) -> None:
        """Remove every temporary file; nothing is published."""
        self._closed = True
        for target in self._targets:
            with suppress(OSError):
                target.handle.close()
            target.temp.unlink(missing_ok=True)

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _fsync_dir(directory: Path) -> None:
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
