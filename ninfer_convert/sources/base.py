"""What every checkpoint source offers the converter, and the helpers the sources share.

A recipe never opens files itself: it asks a source for names, shapes, storage dtypes and one
tensor at a time. Keeping that surface small lets the same recipe read a local directory, a Hub
snapshot or a GGUF file, and keeps peak memory at one tensor (plus what the recipe holds).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import xxhash

from ..errors import SourceError

if TYPE_CHECKING:
    import torch

#: Hash files in pieces of this size so a large tokenizer.json does not need a second copy.
_HASH_CHUNK = 1 << 20


@runtime_checkable
class TensorSource(Protocol):
    """A read-only, lazily loaded set of named tensors (one checkpoint)."""

    #: what to show the user: a path or a Hub repo id
    id: str

    def keys(self) -> list[str]:
        """Every tensor name, sorted."""
        ...

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's logical shape, outermost dimension first (torch order)."""
        ...

    def dtype(self, name: str) -> str:
        """How the tensor is stored: a safetensors dtype string or a ggml type name."""
        ...

    def load(self, name: str) -> torch.Tensor:
        """One tensor on the CPU; a missing name raises ``SourceError``."""
        ...

    def provenance(self) -> dict[str, Any]:
        """JSON-able record of where the tensors came from, for the conversion report."""
        ...


def xxh3_hex(data: bytes) -> str:
    """xxh3-64 of ``data`` as 16 lowercase hex digits (the digest used in provenance)."""
    return xxhash.xxh3_64_hexdigest(data)


def xxh3_file(path: Path) -> str:
    """xxh3-64 of a whole file, read in chunks."""
    digest = xxhash.xxh3_64()
    with path.open("rb") as stream:
        while chunk := stream.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def missing_tensor(name: str, source_id: str, known: list[str]) -> SourceError:
    """The error for a name the source lacks, with near misses to catch typos and prefixes."""
    hints = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
    hint = f"; did you mean {', '.join(repr(h) for h in hints)}?" if hints else ""
    return SourceError(f"tensor {name!r} is not in {source_id} ({len(known)} tensors){hint}")
