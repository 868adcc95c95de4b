"""The header and tensor table of a GGUF file, and the parts of a split one.

gguf-py's ``GGUFReader`` parses the header and key/values; the tensor table is taken from its
parsed tensor-info fields rather than from ``GGUFReader.tensors``, because the stock reader
refuses a whole file as soon as one tensor has a type its enum lacks: ggml type 42 (Q2_0) is
newer than gguf-py, and real files mix it with ordinary types.

A split GGUF (``NAME-00001-of-0000n.gguf`` ...: ``split.no`` / ``split.count`` /
``split.tensors.count``, the metadata in the first part) is opened by its first part: the
others are found beside it by name, each checked to be the part it says, and their tensors
read as one table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader

from ..errors import SourceError
from .ggml_types import block_geometry, ggml_type_name


class HeaderReader(GGUFReader):
    """GGUFReader that keeps the tensor-info fields instead of building typed tensor views."""

    tensor_infos: list[Any]

    def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
        self.tensor_infos = fields
        self.tensors = []


@dataclass(frozen=True)
class TableEntry:
    """One tensor of the table: where its bytes lie and how they are blocked."""

    name: str
    ggml_type: int
    #: ggml order: ne0 (the contiguous axis) first
    ne: tuple[int, ...]
    offset: int
    #: (values per block, bytes per block), or None for a type nobody here knows
    block: tuple[int, int] | None
    #: which part of a split GGUF holds it
    part: int = 0

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.ne))

    @property
    def rows(self) -> int:
        return int(np.prod(self.ne[1:], dtype=np.int64)) if len(self.ne) > 1 else 1

    @property
    def row_bytes(self) -> int:
        assert self.block is not None
        values, size = self.block
        return self.ne[0] // values * size if self.ne else size


def open_reader(path: Path) -> HeaderReader:
    """The parsed header of one GGUF file (little-endian only)."""
    if not path.is_file():
        raise SourceError(f"{path}: no such GGUF file")
    try:
        reader = HeaderReader(path, "r")
    except Exception as exc:  # gguf-py raises ValueError, IndexError, struct errors ...
        raise SourceError(f"{path} is not a readable GGUF file: {exc}") from exc
    if reader.byte_order != "I":
        raise SourceError(f"{path} is a byte-swapped (big-endian) GGUF; not supported")
    return reader


def field(reader: HeaderReader, key: str) -> Any:
    """One key's decoded value, or None when the header lacks it."""
    found = reader.fields.get(key)
    return None if found is None else found.contents()


#: a part of a split GGUF, as llama.cpp's gguf-split and gguf-py's writer name them
SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def split_parts(path: Path, reader: HeaderReader) -> list[tuple[Path, HeaderReader]]:
    """Every part of the GGUF ``path`` begins (itself alone when it is not split): the
    metadata is the first part's, the tensors are spread over all of them."""
    count = int(field(reader, "split.count") or 1)
    if count <= 1:
        return [(path, reader)]
    no = int(field(reader, "split.no") or 0)
    match = SPLIT_NAME.match(path.name)
    if no != 0 or match is None:
        raise SourceError(
            f"{path} is part {no + 1} of a {count}-part GGUF: give the first part "
            "(NAME-00001-of-NNNNN.gguf); the others are found beside it"
        )
    parts = [(path, reader)]
    for i in range(1, count):
        name = f"{match['stem']}-{i + 1:05d}-of-{count:05d}.gguf"
        part = path.with_name(name)
        other = open_reader(part)
        if (
            int(field(other, "split.no") or 0) != i
            or int(field(other, "split.count") or 1) != count
        ):
            raise SourceError(f"{part}: not part {i + 1} of {count} of {path.name}'s split GGUF")
        parts.append((part, other))
    return parts


def read_tensor_table(
    index: int, path: Path, reader: HeaderReader, tensors: dict[str, TableEntry]
) -> None:
    """Add part ``index``'s tensors to ``tensors``, each checked to fit its blocks and the
    file, so a truncated download fails when it is opened rather than mid-conversion."""
    start = int(reader.data_offset)
    file_size = int(reader.data.shape[0])
    for info in reader.tensor_infos:
        _, name_bytes, _, dims, raw_type, rel_offset = info.parts
        name = bytes(name_bytes).decode("utf-8", errors="replace")
        if name in tensors:
            raise SourceError(f"{path} holds a second tensor named {name!r}")
        ggml_type = int(raw_type[0])
        tensor = TableEntry(
            name=name,
            ggml_type=ggml_type,
            ne=tuple(int(d) for d in dims),
            offset=start + int(rel_offset[0]),
            block=block_geometry(ggml_type),
            part=index,
        )
        if tensor.block is not None:
            values = tensor.block[0]
            if tensor.ne and tensor.ne[0] % values:
                raise SourceError(
                    f"{path}: tensor {name!r} ({ggml_type_name(ggml_type)}) has a row "
                    f"of {tensor.ne[0]} values, not a multiple of the {values}-value block"
                )
            end = tensor.offset + tensor.rows * tensor.row_bytes
            if end > file_size:
                raise SourceError(
                    f"{path}: tensor {name!r} ends at byte {end} but the file has "
                    f"{file_size} bytes (truncated download?)"
                )
        tensors[name] = tensor
