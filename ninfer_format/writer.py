"""Writing a v3 file set: plan first, stream bytes, publish atomically.

Every object's size follows from its declaration (shape, format, layout; a resource's stored
length), so the writer fixes the whole directory before the first payload byte: placement,
sharding and the JSON reservation. Objects are then streamed in directory order, each exactly
once, into locked temporary files next to the target (see ``fileset``). Checksums (xxh3-64,
fixed 16 hex digits) are patched into the reserved JSON at the end; the digests of each
object's declaration and the artifact id (see ``declaration``) are known up front.

Publishing replaces the artifact in one step, the rename of the entry file. The continuation
files are renamed first, to names no file has (the spec's ``<entry>.part-0001`` where free,
else with a generation suffix), so the old artifact stays whole until its entry is replaced;
the parts only the old artifact used are deleted after. Sidecar files (a conversion report)
are moved aside before that rename and renamed in after it, so a sidecar never describes
another artifact. A failure before the entry rename, Ctrl-C included, removes every new file
and puts a moved sidecar back; what a killed writer leaves behind, the next writer of the same
target removes.
"""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import xxhash

from .codecs import codec_for
from .declaration import declaration_digest
from .errors import ArtifactError, TargetExists, WriteError
from .fileset import (
    create_locked,
    name_limit,
    remove_stale_temps,
    remove_unused_parts,
    temp_name,
)
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
class _File:
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
        self._targets: list[_File] = []  # the entry, then the parts
        self._sidecars: list[_File] = []
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
        provenance = dict(provenance or {})
        provenance["checksums"] = {r["id"]: CHECKSUM_PLACEHOLDER for r in records}
        # what the checksums cannot see: a relabelled declaration, an edited header id
        provenance["declarations"] = {r["id"]: declaration_digest(r) for r in records}
        provenance["artifact_id"] = self.artifact_id.hex()
        document = {
            "components": components,
            "objects": records,
            "bindings": bindings,
            "uses": list(uses),
            "metadata": metadata or {},
            "provenance": provenance,
        }
        self.directory, self._json = self._plan_files(document, payload, shard_limit)
        self._records = records
        self._token = secrets.token_hex(4)
        self._check_name_lengths([self.path.name, *(f.path for f in self.files[1:])])
        self._progress = _Progress()
        self._checksums: dict[str, str] = {}
        self._cursor = 0  # logical payload bytes written so far
        with self._cleaning_up():
            remove_stale_temps(self.path.parent, self.path.name)
            self._open_targets()

    # ----------------------------------------------------------------- planning
    def _refuse_existing(self) -> None:
        if not self.overwrite and os.path.lexists(self.path):
            raise TargetExists(self.path)

    def _plan_files(
        self, document: dict[str, Any], payload: int, limit: int
    ) -> tuple[Directory, bytes]:
        """The directory with part names that no existing file has (see the module docstring)."""
        generation = None
        while True:
            directory, text = self._reserve(document, payload, limit, generation)
            parts = [self.path.with_name(f.path) for f in directory.files[1:]]
            if not any(os.path.lexists(p) for p in parts):
                return directory, text
            generation = secrets.token_hex(4)

    def _reserve(
        self, document: dict[str, Any], payload: int, limit: int, generation: str | None
    ) -> tuple[Directory, bytes]:
        """The section 1.6 loop: reserve JSON space to a page boundary, then shard."""
        document = dict(document, files=[{"path": None, "payload_bytes": payload}])
        directory = self._validated(document)
        reserve = align_up(HEADER_BYTES + len(dump_directory_text(directory.to_document())), PAGE)
        reserve -= HEADER_BYTES
        while True:
            try:
                sizes = shard_sizes(HEADER_BYTES + reserve, payload, limit)
            except WriteError as exc:
                raise WriteError(f"{self.path}: {exc}") from None
            files = [{"path": None, "payload_bytes": sizes[0]}]
            files += [
                {"path": part_file_name(self.path.name, i, generation), "payload_bytes": n}
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
                f"{self.path}: the directory to write is invalid", problems=exc.problems
            ) from None
        return directory

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
    def _create(self, final_name: str) -> _File:
        final = self.path.with_name(final_name)
        temp = self.path.with_name(temp_name(final_name, self._token))
        aside = self.path.with_name(temp_name(f"{final_name}.old", self._token))
        return _File(final, temp, create_locked(temp), aside)

    def _open_targets(self) -> None:
        names = [self.path.name, *(f.path for f in self.files[1:])]
        for i, name in enumerate(names):
            target = self._create(name)
            self._targets.append(target)
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
            self._sidecars.append(sidecar)
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
            for target, f in zip(self._targets, self.files, strict=True):
                if target.written != f.payload_bytes:
                    raise WriteError(f"{self.path}: {target.final.name}: payload size mismatch")
            for f in [*self._targets, *self._sidecars]:
                f.seal()
            self._publish()
        self._release()
        self._closed = True
        return self.directory

    def _publish(self) -> None:
        self._refuse_existing()
        entry, *parts = self._targets
        for part in parts:
            part.move()  # to a name no file had: the old artifact is untouched
        _fsync_dir(self.path.parent)  # parts durable before the entry refers to them
        for sidecar in self._sidecars:
            sidecar.set_aside()
        entry.move()  # the one step that replaces the artifact
        try:
            for sidecar in self._sidecars:
                sidecar.move()
            _fsync_dir(self.path.parent)
        finally:
            self._remove_replaced()

    def _remove_replaced(self) -> None:
        """After the swap, whatever else happens: delete what only the old artifact used."""
        for sidecar in self._sidecars:
            with suppress(OSError):
                sidecar.settle_aside(published=True)
        if self._published():  # another writer of this target may have swapped in since
            used = {f.path for f in self.files[1:]}
            remove_unused_parts(self.path.parent, self.path.name, used)

    def _published(self) -> bool:
        """Whether the file at the target path is the entry this writer made."""
        if not self._targets:
            return False
        try:
            mine = os.fstat(self._targets[0].handle.fileno())
            return os.path.samestat(mine, os.stat(self.path))
        except (OSError, ValueError):  # ValueError: the handle is closed
            return False

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
        if self._published():
            return WriteError(f"{self.path}: published, but a sidecar failed: {reason}")
        return WriteError(f"{self.path}: cannot write ({reason}); the target is unchanged")

    def abort(self) -> None:
        """Remove every file not published; nothing of a failed run stays visible."""
        self._closed = True
        published = self._published()
        for f in [*self._targets, *self._sidecars]:
            with suppress(OSError):
                if not (published and f.moved):
                    f.location.unlink(missing_ok=True)
                f.settle_aside(published=published)
        self._release()

    def _release(self) -> None:
        """Close every handle, which also drops the locks."""
        for f in [*self._targets, *self._sidecars]:
            with suppress(OSError):
                f.handle.close()

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
