"""One safetensors file's header, read and checked without touching the tensor bytes.

The checks are the ones that would otherwise surface as an obscure error from the Rust reader
in the middle of a conversion: a header that does not parse, a tensor entry without
dtype/shape/offsets, or byte ranges that run past the end of a truncated file.

The header digest (xxh3-64 of the 8-byte length and the JSON that follows) stands for the file
in provenance: the header pins every tensor's name, dtype, shape and byte range, and a
full-content hash would read the whole checkpoint a second time.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import SourceError
from .base import xxh3_hex

#: safetensors refuses headers above 100 MB; anything larger means the length word is garbage
MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class HeaderTensor:
    """One tensor of a header: the file holding it (relative to the directory) and its type."""

    file: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class WeightFile:
    """One safetensors file: its size, its header digest and the tensors its header lists."""

    size: int
    header_digest: str
    tensors: dict[str, HeaderTensor]


def read_safetensors_header(path: Path, rel: str) -> WeightFile:
    """Read and check the header of ``path`` (``rel``: its name relative to the directory)."""

    def bad(why: str) -> SourceError:
        return SourceError(f"{path} is not a valid safetensors file: {why}")

    try:
        size = path.stat().st_size
        with path.open("rb") as stream:
            prefix = stream.read(8)
            if len(prefix) < 8:
                raise bad(f"only {len(prefix)} bytes long")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
                raise bad(f"header length {header_len} does not fit the {size}-byte file")
            header = stream.read(header_len)
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        entries = json.loads(header)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"header is not JSON ({exc})") from exc
    if not isinstance(entries, dict):
        raise bad("header is not a JSON object")

    data_bytes = size - 8 - header_len
    tensors: dict[str, HeaderTensor] = {}
    for name, entry in entries.items():
        if name == "__metadata__":
            continue
        try:
            dtype = entry["dtype"]
            shape = tuple(entry["shape"])
            begin, end = entry["data_offsets"]
            valid = (
                isinstance(dtype, str)
                and all(isinstance(d, int) and d >= 0 for d in shape)
                and isinstance(begin, int)
                and isinstance(end, int)
                and 0 <= begin <= end
            )
        except (TypeError, KeyError, ValueError):
            valid = False
        if not valid:
            raise bad(f"malformed header entry for tensor {name!r}: {entry!r}")
        if end > data_bytes:
            raise bad(
                f"tensor {name!r} ends at byte {end} of the data section, which holds only "
                f"{data_bytes} bytes (truncated download?)"
            )
        tensors[name] = HeaderTensor(rel, dtype, shape)
    return WeightFile(size, xxh3_hex(prefix + header), tensors)
