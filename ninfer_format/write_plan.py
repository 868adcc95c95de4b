"""Planning a v3 file set before its first payload byte.

Every object's size follows from its declaration (shape, format, layout; a resource's stored
length), so the writer fixes the whole directory up front: placement, sharding and the JSON
reservation. Checksums (xxh3-64, fixed 16 hex digits) are placeholders here, patched into the
reserved JSON once the bytes are written; the digests of each object's declaration and the
artifact id (see ``declaration``) are known now.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .codecs import codec_for
from .declaration import declaration_digest
from .errors import ArtifactError, WriteError
from .framing import HEADER_BYTES, PAGE, align_up, part_file_name, shard_sizes
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


def planned_document(
    records: list[dict[str, Any]],
    *,
    components: dict[str, Any],
    bindings: dict[str, Any],
    uses: Iterable[dict[str, Any]],
    metadata: dict[str, Any] | None,
    provenance: dict[str, Any] | None,
    artifact_id: bytes,
) -> dict[str, Any]:
    """The directory document without its files, checksums as placeholders of final width."""
    provenance = dict(provenance or {})
    provenance["checksums"] = {r["id"]: CHECKSUM_PLACEHOLDER for r in records}
    # what the checksums cannot see: a relabelled declaration, an edited header id
    provenance["declarations"] = {r["id"]: declaration_digest(r) for r in records}
    provenance["artifact_id"] = artifact_id.hex()
    return {
        "components": components,
        "objects": records,
        "bindings": bindings,
        "uses": list(uses),
        "metadata": metadata or {},
        "provenance": provenance,
    }


def plan_files(
    path: Path, document: dict[str, Any], payload: int, limit: int
) -> tuple[Directory, bytes]:
    """The directory and its padded JSON, with part names that no existing file has: the old
    artifact must stay whole until its entry is replaced (see ``staging``)."""
    generation = None
    while True:
        directory, text = _reserve(path, document, payload, limit, generation)
        parts = [path.with_name(f.path) for f in directory.files[1:]]
        if not any(os.path.lexists(p) for p in parts):
            return directory, text
        generation = secrets.token_hex(4)


def _reserve(
    path: Path, document: dict[str, Any], payload: int, limit: int, generation: str | None
) -> tuple[Directory, bytes]:
    """The section 1.6 loop: reserve JSON space to a page boundary, then shard."""
    document = dict(document, files=[{"path": None, "payload_bytes": payload}])
    directory = validated_directory(path, document)
    reserve = align_up(HEADER_BYTES + len(dump_directory_text(directory.to_document())), PAGE)
    reserve -= HEADER_BYTES
    while True:
        try:
            sizes = shard_sizes(HEADER_BYTES + reserve, payload, limit)
        except WriteError as exc:
            raise WriteError(f"{path}: {exc}") from None
        files = [{"path": None, "payload_bytes": sizes[0]}]
        files += [
            {"path": part_file_name(path.name, i, generation), "payload_bytes": n}
            for i, n in enumerate(sizes[1:], start=1)
        ]
        directory = validated_directory(path, dict(document, files=files))
        text = dump_directory_text(directory.to_document())
        if len(text) <= reserve:
            return directory, text + b" " * (reserve - len(text))
        reserve = align_up(HEADER_BYTES + len(text), PAGE) - HEADER_BYTES


def validated_directory(path: Path, document: dict[str, Any]) -> Directory:
    """The document as a checked directory; a reader's rule it breaks is a ``WriteError``."""
    try:
        directory = parse_directory(document)
        check_directory(directory, path.name)
    except ArtifactError as exc:
        raise WriteError(
            f"{path}: the directory to write is invalid", problems=exc.problems
        ) from None
    return directory
