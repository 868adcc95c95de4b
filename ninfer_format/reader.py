"""Reading a v3 file set: the opened artifact, its objects, parameters and resources.

``Artifact.open`` validates R1-R12 from the entry alone (see ``entry_file``). Continuation
files are opened (and R15-checked) on first need (see ``payload_files``); an object's format,
layout, size and alignment (R13, R14) are checked when it is first interpreted. Reads of an
object that lies in one file are zero-copy views of a memory map.
"""

from __future__ import annotations

import math
import os
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from .binders import BinderReport, bind
from .codecs import TensorCodec, codec_for
from .entry_file import read_entry
from .errors import ArtifactError, CodecError, LookupFailed, ResourceError
from .framing import HEADER_BYTES, PAGE, align_up
from .payload_files import PayloadFile, PayloadFiles
from .resources import decode_resource
from .schema import Component, Directory, Resource, Tensor, Use, WholeBinding


class Artifact:
    """An opened ``.ninfer`` v3 artifact. Use as a context manager or call ``close()``."""

    def __init__(self, path: Path, directory: Directory, artifact_id: bytes, json_bytes: int):
        self.path = path
        self.directory = directory
        self.artifact_id = artifact_id
        self.json_bytes = json_bytes
        self.entry_payload_start = align_up(HEADER_BYTES + json_bytes, PAGE)
        self._payload = PayloadFiles(path, directory.files, artifact_id, self.entry_payload_start)
        self.files: list[PayloadFile] = self._payload.files
        self.payload_bytes = self._payload.payload_bytes
        self._checked: dict[str, TensorCodec] = {}

    # ----------------------------------------------------------------- opening
    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Artifact:
        path = Path(path)
        directory, header = read_entry(path)
        return cls(path, directory, header.artifact_id, header.json_bytes)

    def close(self) -> None:
        self._payload.close()

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
    def segments(self, offset: int, length: int) -> list[tuple[int, int, int, int]]:
        """Map a logical range to ``(file index, file offset, destination offset, bytes)``."""
        return self._payload.segments(offset, length)

    def read(self, offset: int, length: int) -> np.ndarray:
        """Logical payload bytes as uint8; a zero-copy view when the range lies in one file."""
        return self._payload.read(offset, length)

    def read_file(self, index: int, file_offset: int, length: int) -> np.ndarray:
        """Bytes of one file of the set by file offset (headers included), as a view."""
        return self._payload.read_file(index, file_offset, length)

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
