"""Byte framing of a v3 file set: headers, alignment, the logical payload and sharding."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import FramingError, PartFileError, WriteError

ENTRY_MAGIC = b"NINFER\x00\x03"
V2_ENTRY_MAGIC = b"NINFER\x00\x02"
PART_MAGIC = b"NINPRT\x00\x03"
HEADER_BYTES = 32
PAGE = 4096
PART_PAYLOAD_START = PAGE
U64_MAX = 2**64 - 1
DEFAULT_SHARD_LIMIT = 32_000_000_000


def align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def part_file_name(entry_name: str, index: int, generation: str | None = None) -> str:
    """Writer naming rule: ``<entry>.part-0001``; five or more digits are written in full.

    A replacement whose old artifact holds those names adds a ``.<generation>`` suffix, so the
    new parts never overwrite the old ones (readers find parts by ``files[i].path`` only)."""
    name = f"{entry_name}.part-{index:04d}"
    return name if generation is None else f"{name}.{generation}"


@dataclass(frozen=True)
class EntryHeader:
    json_bytes: int
    artifact_id: bytes

    @property
    def metadata_end(self) -> int:
        return HEADER_BYTES + self.json_bytes

    @property
    def payload_start(self) -> int:
        return align_up(self.metadata_end, PAGE)

    def pack(self) -> bytes:
        return ENTRY_MAGIC + struct.pack("<Q", self.json_bytes) + self.artifact_id


def parse_entry_header(head: bytes, file_size: int, name: str) -> EntryHeader:
    """Rules R1 and R2."""
    if len(head) < HEADER_BYTES or file_size < HEADER_BYTES:
        raise FramingError(f"{name}: {file_size} bytes is shorter than the 32-byte v3 header")
    magic = head[:8]
    if magic == V2_ENTRY_MAGIC:
        raise FramingError(
            f"{name}: this is a .ninfer v2 container; ninfer reads v3 only, "
            "convert the model again from its source checkpoint"
        )
    if magic != ENTRY_MAGIC:
        if magic == PART_MAGIC:
            raise FramingError(f"{name}: this is a continuation part file; open the entry file")
        raise FramingError(f"{name}: not a .ninfer v3 entry (magic {magic.hex(' ')})")
    (json_bytes,) = struct.unpack_from("<Q", head, 8)
    if not 0 < json_bytes <= file_size - HEADER_BYTES:
        raise FramingError(
            f"{name}: header json_bytes={json_bytes} must be > 0 and at most "
            f"{file_size - HEADER_BYTES} (file size minus header)"
        )
    return EntryHeader(json_bytes, bytes(head[16:32]))


def pack_part_header(index: int, artifact_id: bytes) -> bytes:
    return PART_MAGIC + struct.pack("<Q", index) + artifact_id


def check_part_header(
    head: bytes, file_size: int, name: str, index: int, artifact_id: bytes, payload_bytes: int
) -> None:
    """Rule R15 for continuation file ``index``."""
    if len(head) < HEADER_BYTES:
        raise PartFileError(f"{name}: {len(head)} bytes is shorter than the 32-byte part header")
    if head[:8] != PART_MAGIC:
        raise PartFileError(f"{name}: not a v3 continuation file (magic {head[:8].hex(' ')})")
    (found,) = struct.unpack_from("<Q", head, 8)
    if found != index:
        raise PartFileError(f"{name}: part_index is {found}, expected {index}")
    if head[16:32] != artifact_id:
        raise PartFileError(
            f"{name}: artifact_id {head[16:32].hex()} differs from the entry's {artifact_id.hex()}"
            " (a part of another artifact)"
        )
    expected = PART_PAYLOAD_START + payload_bytes
    if file_size != expected:
        raise PartFileError(
            f"{name}: file is {file_size} bytes, expected {expected} "
            f"(4096 + files[{index}].payload_bytes)"
        )


def shard_sizes(entry_payload_start: int, payload_bytes: int, limit: int) -> list[int]:
    """Split the logical payload into per-file byte counts (section 1.6); ``limit`` 0 = one file."""
    if limit == 0 or entry_payload_start + payload_bytes <= limit:
        return [payload_bytes]
    entry_capacity = (limit - entry_payload_start) // PAGE * PAGE
    part_capacity = (limit - PART_PAYLOAD_START) // PAGE * PAGE
    if entry_payload_start >= limit or entry_capacity <= 0 or part_capacity <= 0:
        raise WriteError(
            f"shard limit {limit} is too small: the entry header and directory alone take "
            f"{entry_payload_start} bytes and each file needs room for a 4096-byte page"
        )
    sizes = [entry_capacity]
    rest = payload_bytes - entry_capacity
    while rest > 0:
        sizes.append(min(part_capacity, rest))
        rest -= sizes[-1]
    return sizes
