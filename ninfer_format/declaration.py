"""Digests of what each object record declares about reading its bytes.

An object's checksum covers its bytes, not the record that says how to read them. Formats of
one byte geometry (``q4_g64_fp16`` and ``nf4_g64_fp16``), a ``zstd_v1`` frame relabelled
``raw_bytes_v1``, or a shape with the same element count all keep every byte, so only a digest
of the declaration itself can show such an edit. The writer records one per object under
``provenance.declarations``; ``verify`` recomputes them.

The declaration is a tensor's kind, shape, format, layout and divisors, or a resource's kind and
encoding. Placement (offset, bytes) is left out: the byte checksum is already taken at the
declared place, and the id is the key the digest is filed under.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import xxhash

from .schema import Resource, Tensor

# one encoder, compact: a digest per object adds up at 100k objects
_compact_json = json.JSONEncoder(separators=(",", ":")).encode


def _declared(record: Mapping[str, Any] | Tensor | Resource) -> list[Any]:
    """``[kind, shape, format, layout, divisors]`` or ``[kind, encoding]``; divisors is null
    when absent. A writer's dict record and a reader's parsed one give the same list."""
    if isinstance(record, Tensor):
        return ["tensor", list(record.shape), record.format, record.layout, record.divisors]
    if isinstance(record, Resource):
        return ["resource", record.encoding]
    if record["kind"] == "resource":
        return ["resource", record["encoding"]]
    shape = list(record["shape"])
    return ["tensor", shape, record["format"], record["layout"], record.get("divisors")]


def declaration_digest(record: Mapping[str, Any] | Tensor | Resource) -> str:
    """xxh3-64 (16 lowercase hex digits) of the declaration as a compact JSON array."""
    return xxhash.xxh3_64_hexdigest(_compact_json(_declared(record)).encode())


def describe_declaration(record: Tensor | Resource) -> str:
    """The declaration in words, for messages: ``tensor q4_g64_fp16/row_split_k128_v1 [64, 8]``."""
    if isinstance(record, Resource):
        return f"resource {record.encoding}"
    divisors = f" divisors {record.divisors}" if record.divisors is not None else ""
    return f"tensor {record.format}/{record.layout} {list(record.shape)}{divisors}"
