"""Reading a v3 file set: open-time validation, lazy parts, range reads and decoding.

``Artifact.open`` validates R1-R12 from the entry alone. Continuation files are opened (and
R15-checked) on first need; an object's format, layout, size and alignment (R13, R14) are
checked when it is first interpreted. Reads of an object that lies in one file are zero-copy
views of a memory map.
"""

from __future__ import annotations

import gc
import math
import mmap
import os
from bisect import bisect_right
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from .binders import BinderReport, bind
from .codecs import TensorCodec, codec_for
from .errors import (
    ArtifactError,
    CodecError,
    FramingError,
    LookupFailed,
    MissingFile,
    PartFileError,
    ResourceError,
)
from .fileset import name_limit
from .framing import (
    HEADER_BYTES,
    PAGE,
    PART_PAYLOAD_START,
    align_up,
    check_part_header,
    parse_entry_header,
)
from .jsontext import parse_directory_text
from .resources import decode_resource
from .schema import Component, Directory, Resource, Tensor, Use, WholeBinding
from .validate import check_directory, parse_directory

#: A directory larger than this is refused before it is read (100k objects take ~20 MB).
MAX_DIRECTORY_BYTES = 512 * 1024 * 1024


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Building ~10^6 small containers triggers the cyclic GC over and over; none form cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _not_an_entry(path: Path) -> MissingFile:
    if path.is_dir():
        entries = sorted(p.name for p in path.glob("*.ninfer") if p.is_file())
        listed = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        return MissingFile(
            f"{path}: is a directory; an artifact is opened by its entry file"
            + (f" (here: {listed})" if entries else " (none here ends in .ninfer)")
        )
    if path.exists():
        return MissingFile(f"{path}: not a regular file; an artifact is opened by its entry file")
    return MissingFile(f"{path}: no such file")


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


class Artifact:
    """An opened ``.ninfer`` v3 artifact. Use as a context manager or call ``close()``."""

    def __init__(self, path: Path, directory: Directory, artifact_id: bytes, json_bytes: int):
        self.path = path
        self.directory = directory
        self.artifact_id = artifact_id
        self.json_bytes = json_bytes
        self.entry_payload_start = align_up(HEADER_BYTES + json_bytes, PAGE)
        files, start = [], 0
        for i, f in enumerate(directory.files):
            where = path if i == 0 else path.parent / f.path  # type: ignore[operator]
            first = self.entry_payload_start if i == 0 else PART_PAYLOAD_START
            files.append(PayloadFile(i, where, first, start, f.payload_bytes))
            start += f.payload_bytes
        self.files: list[PayloadFile] = files
        self.payload_bytes = start
        self._starts = [f.logical_start for f in files]
        self._maps: dict[int, mmap.mmap] = {}
        self._checked: dict[str, TensorCodec] = {}

    # ----------------------------------------------------------------- opening
    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Artifact:
        path = Path(path)
        if not path.is_file():
            raise _not_an_entry(path)
        try:
            with path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                header = parse_entry_header(fh.read(HEADER_BYTES), size, path.name)
                if header.json_bytes > MAX_DIRECTORY_BYTES:
                    raise FramingError(
                        f"{path.name}: directory of {header.json_bytes} bytes exceeds the "
                        f"{MAX_DIRECTORY_BYTES}-byte limit"
                    )
                raw = fh.read(header.json_bytes)
        except OSError as exc:
            raise FramingError(f"{path}: cannot read: {exc.strerror}") from None
        if len(raw) != header.json_bytes:
            raise FramingError(f"{path.name}: file ends inside the JSON directory")
        with _collector_paused():
            directory = parse_directory(parse_directory_text(raw))
            check_directory(directory, path.name)
        expected = header.payload_start + directory.files[0].payload_bytes
        if size != expected:
            raise FramingError(
                f"{path.name}: file is {size} bytes, expected {expected} (payload start "
                f"{header.payload_start} + files[0].payload_bytes "
                f"{directory.files[0].payload_bytes})"
            )
        return cls(path, directory, header.artifact_id, header.json_bytes)

    def close(self) -> None:
        for mm in self._maps.values():
            with suppress(BufferError):  # a caller still holds a zero-copy view of it
                mm.close()
        self._maps.clear()

    def __enter__(self) -> Artifact:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- directory
    @property
    def components(self) -> dict[str, Component]:
        return self.directory.components

    @cached_property
    def objects(self) -> dict[str, Tensor | Resource]:
        return {obj.id: obj for obj in self.directory.objects}

    @property
    def bindings(self):  # type: ignore[no-untyped-def]
        return self.directory.bindings

    @property
    def uses(self) -> list[Use]:
        return self.directory.uses

    @property
    def metadata(self) -> dict[str, Any]:
        return self.directory.metadata or {}

    @property
    def provenance(self) -> dict[str, Any]:
        return self.directory.provenance or {}

    @cached_property
    def binder_report(self) -> BinderReport:
        return bind(self.directory)

    # ----------------------------------------------------------------- bytes
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

    def raw(self, object_id: str) -> np.ndarray:
        """The stored bytes of an object (uint8)."""
        obj = self.object(object_id)
        return self.read(obj.offset, obj.bytes)

    def object(self, object_id: str) -> Tensor | Resource:
        try:
            return self.objects[object_id]
        except KeyError:
            raise LookupFailed(f"object {object_id!r} does not exist") from None

    # --------------------------------------------------------------- tensors
    def codec(self, object_id: str) -> TensorCodec:
        """The codec of a tensor object after the lazy checks R13 and R14."""
        codec = self._checked.get(object_id)
        if codec is not None:
            return codec
        obj = self.object(object_id)
        if not isinstance(obj, Tensor):
            raise LookupFailed(f"object {object_id!r} is a resource, not a tensor")
        try:
            codec = codec_for(obj.format, obj.layout)
            divisors = obj.divisors or 1
            size = codec.encoded_size(tuple(obj.shape), divisors)
        except CodecError as exc:
            raise CodecError(f"object {object_id!r}: {exc}") from None
        if obj.bytes != size:
            raise CodecError(
                f"object {object_id!r}: bytes is {obj.bytes}, but {obj.format}/{obj.layout} "
                f"of shape {obj.shape} takes {size}"
            )
        if obj.offset % codec.alignment:
            raise CodecError(
                f"object {object_id!r}: offset {obj.offset} is not a multiple of "
                f"{codec.alignment} ({obj.layout} alignment)"
            )
        self._checked[object_id] = codec
        return codec

    def tensor(self, object_id: str) -> np.ndarray:
        """Decoded values (float32, or int32 for int32 objects) in the object's shape."""
        codec = self.codec(object_id)
        obj = self.objects[object_id]
        assert isinstance(obj, Tensor)
        try:
            return codec.decode(self.raw(object_id), tuple(obj.shape), obj.divisors or 1)
        except CodecError as exc:
            raise CodecError(f"object {object_id!r}: {exc}") from None

    def parameter(
        self, name: str, shape: tuple[int, ...] | None = None, *, in_order: bool = False
    ) -> np.ndarray:
        """A bound parameter: the whole object, or its parts concatenated (flat, C order).

        The result is reshaped to ``shape`` if given, else to the binder's expected shape when
        the architecture is known, else left as the object's shape / a flat vector. The
        values are as stored; with ``in_order``, a weight whose input columns are stored out
        of order (``input_columns``) has them put in place: the matrix a product computes
        with.
        """
        binding = self.bindings.get(name)
        if binding is None:
            raise LookupFailed(f"parameter {name!r} has no binding")
        values = self._bound(binding, f"parameter {name!r}")
        if shape is None:
            shape = self.binder_report.parameters.get(name)
        if shape is not None:
            if math.prod(shape) != values.size:
                raise ArtifactError(
                    f"parameter {name!r}: {values.size} elements cannot take shape {list(shape)}"
                )
            values = values.reshape(shape)
        columns = self.input_columns(name) if in_order else None
        if columns is not None:
            placed = np.empty_like(values)
            placed[:, columns] = values
            values = placed
        return values

    def input_columns(self, name: str) -> np.ndarray | None:
        """Where the stored input columns of weight ``name`` belong (the ``input_columns``
        auxiliary of its uses, which GGUF imports keep in llama.cpp's tiled order): stored
        column ``c`` multiplies input element ``columns[c]``; None when they are in order."""
        aux = self._input_column_maps.get(name)
        if aux is None:
            return None
        return self._bound(aux, f"use of {name!r}: input_columns").astype(np.int64)

    @cached_property
    def _input_column_maps(self) -> dict[str, Any]:
        """Parameter -> its uses' ``input_columns`` binding (one pass over the uses: loading
        asks for every parameter)."""
        maps: dict[str, Any] = {}
        for use in self.uses:
            aux = (use.auxiliaries or {}).get("input_columns")
            if aux is not None:
                maps.setdefault(use.parameter, aux)
        return maps

    def _bound(self, binding: Any, what: str) -> np.ndarray:
        """A binding's values: the whole object, or its parts concatenated (flat)."""
        if isinstance(binding, WholeBinding):
            return self.tensor(binding.object)
        total = sum(p.elements for p in binding.parts)
        if total > self._stored_elements:
            raise ArtifactError(
                f"{what}: its parts total {total} elements, more than the "
                f"{self._stored_elements} the artifact stores in all tensors"
            )
        decoded: dict[str, np.ndarray] = {}
        pieces = []
        for part in binding.parts:
            if part.object not in decoded:
                decoded[part.object] = self.tensor(part.object).reshape(-1)
            pieces.append(decoded[part.object][part.range[0] : part.range[1]])
        return np.concatenate(pieces)

    @cached_property
    def _stored_elements(self) -> int:
        return sum(o.elements for o in self.directory.objects if isinstance(o, Tensor))

    # ------------------------------------------------------------- resources
    def resource(self, role: str, component: str = "text") -> bytes:
        """A frontend file by role (e.g. ``tokenizer.json``), decoded from its encoding."""
        comp = self.components.get(component)
        if comp is None:
            raise LookupFailed(f"component {component!r} does not exist")
        oid = (comp.resources or {}).get(role)
        if oid is None:
            raise LookupFailed(f"component {component!r} has no resource {role!r}")
        try:
            return self.decoded_resource(oid)
        except ResourceError as exc:
            raise ResourceError(f"resource {role!r}: {exc}") from None

    def decoded_resource(self, object_id: str) -> bytes:
        """A resource object's bytes, decoded from its encoding."""
        obj = self.object(object_id)
        if not isinstance(obj, Resource):
            raise LookupFailed(f"object {object_id!r} is a tensor, not a resource")
        try:
            return decode_resource(obj.encoding, self.raw(object_id).tobytes())
        except ResourceError as exc:
            raise ResourceError(f"object {object_id!r}: {exc}") from None
