"""A GGUF file (llama.cpp's single-file checkpoint format) as a tensor source.

Two uses drive the interface. A recipe that keeps llama.cpp's blocks verbatim (``gguf_*``
formats, layout ``gguf_blocks_v1``) needs ``raw_blocks``: the stored bytes as
``[rows, row_bytes]``, rows being every dimension but the innermost. A recipe that re-quantizes,
or that transforms a tensor (norm offsets, head order), needs ``load``: float32 values.

gguf-py's ``GGUFReader`` parses the header and key/values; the tensor table is taken from its
parsed tensor-info fields rather than from ``GGUFReader.tensors``, because the stock reader
refuses a whole file as soon as one tensor has a type its enum lacks: ggml type 42 (Q2_0) is
newer than gguf-py, and real files mix it with ordinary types. Sizes of the types gguf-py
knows come from its table, Q2_0's from ``ninfer_format``'s block codec, which also decodes it.

Shapes are reported in NInfer/torch order (outermost first), i.e. ggml's ``ne`` reversed.

A split GGUF (``NAME-00001-of-0000n.gguf`` ...: ``split.no`` / ``split.count`` /
``split.tensors.count``, the metadata in the first part) is opened by its first part: the
others are found beside it by name, each checked to be the part it says, and their tensors
read as one table.

A recipe that keeps blocks copies them without the memory map: ``block_range`` says where a
run of rows lies, ``read_into`` fills a caller's buffer from the file with one positioned read
(``os.preadv``), so a multi-gigabyte copy is a few hundred large sequential reads rather than
page faults. A file that shrank or was replaced after it was opened is caught there, in one
line.

Provenance records the file size and the xxh3-64 of everything before the tensor data (header,
key/values and tensor table), for the same reason as for safetensors: hashing the data would
read a multi-gigabyte file twice.
"""

from __future__ import annotations

import contextlib
import os
import re
import weakref
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ninfer_format.codecs.gguf_blocks import FORMAT_BLOCKS, GGML_TYPE_TO_FORMAT

from ..errors import SourceError
from .base import TensorSource, missing_tensor, xxh3_hex

if TYPE_CHECKING:
    import torch

#: ggml types that gguf-py's enum lacks: id -> (name, values per block, bytes per block)
_EXTRA_TYPES: dict[int, tuple[str, int, int]] = {
    42: ("Q2_0", *FORMAT_BLOCKS[GGML_TYPE_TO_FORMAT[42]][1:]),
}

#: unquantized ggml types and the numpy dtype of their elements
_PLAIN_DTYPES: dict[int, np.dtype] = {
    GGMLQuantizationType.F32: np.dtype("<f4"),
    GGMLQuantizationType.F16: np.dtype("<f2"),
    GGMLQuantizationType.F64: np.dtype("<f8"),
    GGMLQuantizationType.I8: np.dtype("i1"),
    GGMLQuantizationType.I16: np.dtype("<i2"),
    GGMLQuantizationType.I32: np.dtype("<i4"),
    GGMLQuantizationType.I64: np.dtype("<i8"),
}


class _HeaderReader(GGUFReader):
    """GGUFReader that keeps the tensor-info fields instead of building typed tensor views."""

    tensor_infos: list[Any]

    def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
        self.tensor_infos = fields
        self.tensors = []


@dataclass(frozen=True)
class _Tensor:
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


def _close_all(descriptors: dict[int, int]) -> None:
    for fd in descriptors.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    descriptors.clear()


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino


def ggml_type_name(ggml_type: int) -> str:
    """The ggml name of a type id ("Q4_K", "F32", "Q2_0"), or ``TYPE_<id>`` if unknown."""
    if ggml_type in _EXTRA_TYPES:
        return _EXTRA_TYPES[ggml_type][0]
    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"TYPE_{ggml_type}"


def _block_geometry(ggml_type: int) -> tuple[int, int] | None:
    if ggml_type in _EXTRA_TYPES:
        return _EXTRA_TYPES[ggml_type][1:]
    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        return None


def _open_reader(path: Path) -> _HeaderReader:
    if not path.is_file():
        raise SourceError(f"{path}: no such GGUF file")
    try:
        reader = _HeaderReader(path, "r")
    except Exception as exc:  # gguf-py raises ValueError, IndexError, struct errors ...
        raise SourceError(f"{path} is not a readable GGUF file: {exc}") from exc
    if reader.byte_order != "I":
        raise SourceError(f"{path} is a byte-swapped (big-endian) GGUF; not supported")
    return reader


def _field(reader: _HeaderReader, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


#: a part of a split GGUF, as llama.cpp's gguf-split and gguf-py's writer name them
SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def _split_parts(path: Path, reader: _HeaderReader) -> list[tuple[Path, _HeaderReader]]:
    """Every part of the GGUF ``path`` begins (itself alone when it is not split): the
    metadata is the first part's, the tensors are spread over all of them."""
    count = int(_field(reader, "split.count") or 1)
    if count <= 1:
        return [(path, reader)]
    no = int(_field(reader, "split.no") or 0)
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
        other = _open_reader(part)
        if (
            int(_field(other, "split.no") or 0) != i
            or int(_field(other, "split.count") or 1) != count
        ):
            raise SourceError(f"{part}: not part {i + 1} of {count} of {path.name}'s split GGUF")
        parts.append((part, other))
    return parts


class GgufSource(TensorSource):
    """Tensors and key/value metadata of one GGUF file (memory-mapped, read-only), or of a
    split GGUF given its first part."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser().absolute()
        self.id = str(self.path)
        reader = _open_reader(self.path)
        self._reader = reader
        self.version = int(reader.fields["GGUF.version"].parts[0][0])
        self._parts = _split_parts(self.path, reader)
        self._tensors: dict[str, _Tensor] = {}
        for index, (part, part_reader) in enumerate(self._parts):
            self._read_tensor_table(index, part, part_reader)
        total = _field(reader, "split.tensors.count")
        if total is not None and int(total) != len(self._tensors):
            raise SourceError(
                f"{self.path}: the split GGUF lists {int(total)} tensors, its parts hold "
                f"{len(self._tensors)}"
            )
        self._keys = sorted(self._tensors)
        #: (device, inode) of each part as mapped: ``read_into`` opens the path again later,
        #: and a file replaced under the same name in between must not be read in its place
        self._identities = [_identity(os.stat(path)) for path, _ in self._parts]
        #: part index -> file descriptor, opened on the first ``read_into`` of that part
        self._descriptors: dict[int, int] = {}
        weakref.finalize(self, _close_all, self._descriptors)

    def _read_tensor_table(self, index: int, path: Path, reader: _HeaderReader) -> None:
        tensors = self._tensors
        start = int(reader.data_offset)
        file_size = int(reader.data.shape[0])
        for info in reader.tensor_infos:
            _, name_bytes, _, dims, raw_type, rel_offset = info.parts
            name = bytes(name_bytes).decode("utf-8", errors="replace")
            if name in tensors:
                raise SourceError(f"{path} holds a second tensor named {name!r}")
            ggml_type = int(raw_type[0])
            tensor = _Tensor(
                name=name,
                ggml_type=ggml_type,
                ne=tuple(int(d) for d in dims),
                offset=start + int(rel_offset[0]),
                block=_block_geometry(ggml_type),
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

    # -- metadata ----------------------------------------------------------------------------

    @cached_property
    def metadata(self) -> dict[str, Any]:
        """Every key/value of the header (strings decoded, arrays as lists), in file order.

        Built on first use: ``tokenizer.ggml.tokens`` and ``.merges`` run to hundreds of
        thousands of strings, which a pure tensor-copying recipe never needs.
        """
        values: dict[str, Any] = {}
        for key, field in self._reader.fields.items():
            if key.startswith("GGUF."):
                continue  # the reader's pseudo-fields: version and counts
            try:
                values[key] = field.contents()
            except Exception as exc:
                raise SourceError(
                    f"{self.path}: cannot decode metadata key {key!r}: {exc}"
                ) from exc
        return values

    def get(self, key: str, default: Any = None) -> Any:
        """One metadata value, without decoding the large tokenizer arrays."""
        field = self._reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception as exc:
            raise SourceError(f"{self.path}: cannot decode metadata key {key!r}: {exc}") from exc

    @property
    def architecture(self) -> str | None:
        """``general.architecture`` ("qwen35", "qwen35moe", ...), or None if absent."""
        value = self.get("general.architecture")
        return value if isinstance(value, str) else None

    # -- tensors -----------------------------------------------------------------------------

    def _entry(self, name: str) -> _Tensor:
        tensor = self._tensors.get(name)
        if tensor is None:
            raise missing_tensor(name, self.id, self._keys)
        return tensor

    def keys(self) -> list[str]:
        return list(self._keys)

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entry(name).shape

    def dtype(self, name: str) -> str:
        return ggml_type_name(self._entry(name).ggml_type)

    def ggml_type(self, name: str) -> int:
        """The tensor's ggml type id (e.g. 12 for Q4_K, 42 for Q2_0)."""
        return self._entry(name).ggml_type

    def raw_blocks(self, name: str) -> np.ndarray:
        """The stored bytes as read-only uint8 ``[rows, row_bytes]``, a view of the file.

        Rows are all dimensions but the innermost, flattened in order: a rank-3 expert bank of
        shape ``[E, I, H]`` gives ``E * I`` rows, expert ``e`` owning rows ``[e*I, (e+1)*I)``.
        """
        tensor = self._entry(name)
        if tensor.block is None:
            raise SourceError(
                f"{self.id}: tensor {name!r} has ggml type {tensor.ggml_type}, whose block size "
                "is unknown to gguf-py and to ninfer_format"
            )
        size = tensor.rows * tensor.row_bytes
        data = self._parts[tensor.part][1].data[tensor.offset : tensor.offset + size]
        return data.reshape(tensor.rows, tensor.row_bytes)

    def block_range(self, name: str, start: int, stop: int) -> tuple[int, int, int]:
        """Where rows ``[start, stop)`` of ``raw_blocks(name)`` lie: (part, byte offset, bytes)."""
        tensor = self._entry(name)
        if tensor.block is None:
            raise SourceError(
                f"{self.id}: tensor {name!r} has ggml type {tensor.ggml_type}, whose block size "
                "is unknown to gguf-py and to ninfer_format"
            )
        if not 0 <= start <= stop <= tensor.rows:
            raise SourceError(
                f"{self.id}: rows [{start}, {stop}) of tensor {name!r}, which has {tensor.rows}"
            )
        row_bytes = tensor.row_bytes
        return tensor.part, tensor.offset + start * row_bytes, (stop - start) * row_bytes

    def read_into(self, part: int, offset: int, view: memoryview) -> None:
        """Fill ``view`` with the bytes of part ``part`` (0: the file itself) from ``offset``.

        Positioned reads straight into ``view``: no memory map, no intermediate copy. A file
        that ends early (cut or replaced since it was opened) is a one-line ``SourceError``.
        """
        fd = self._descriptors.get(part)
        path = self._parts[part][0]
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise SourceError(f"{path}: cannot open: {exc.strerror}") from None
            if _identity(os.fstat(fd)) != self._identities[part]:
                os.close(fd)
                raise SourceError(
                    f"{path}: replaced by another file since it was opened; convert again"
                )
            self._descriptors[part] = fd
            if hasattr(os, "posix_fadvise"):  # a larger read-ahead window; only a hint
                with contextlib.suppress(OSError):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        done, wanted = 0, view.nbytes
        while done < wanted:
            try:
                got = os.preadv(fd, [view[done:]], offset + done)
            except OSError as exc:
                raise SourceError(
                    f"{path}: cannot read at byte {offset + done}: {exc.strerror}"
                ) from None
            if got == 0:
                raise SourceError(
                    f"{path}: ends at byte {offset + done}, but tensor data runs to byte "
                    f"{offset + wanted} (the file was cut or replaced after it was opened)"
                )
            done += got

    def load(self, name: str) -> torch.Tensor:
        """Values as float32 (integer types keep their integer dtype, F64 stays float64).

        Quantized types are dequantized with gguf-py's reference dequantizers, Q2_0 with the
        ``gguf_q2_0`` codec; the result has ``shape(name)``.
        """
        import torch

        tensor = self._entry(name)
        blocks = self.raw_blocks(name)
        try:
            values = self._values(tensor, blocks)
        except SourceError:
            raise
        except NotImplementedError as exc:
            raise SourceError(
                f"{self.id}: gguf-py cannot dequantize {ggml_type_name(tensor.ggml_type)} "
                f"(tensor {name!r})"
            ) from exc
        except Exception as exc:
            raise SourceError(f"{self.id}: cannot decode tensor {name!r}: {exc}") from exc
        return torch.from_numpy(np.ascontiguousarray(values).reshape(tensor.shape))

    def _values(self, tensor: _Tensor, blocks: np.ndarray) -> np.ndarray:
        plain = _PLAIN_DTYPES.get(tensor.ggml_type)
        if plain is not None:
            values = blocks.view(plain)
            return values.astype(np.float32) if plain == np.float16 else values.copy()
        if tensor.ggml_type == GGMLQuantizationType.BF16:
            # bfloat16 is the high half of a float32: widen the bits, no rounding involved.
            return (blocks.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
        if tensor.ggml_type in _EXTRA_TYPES:
            from ninfer_format.codecs import codec_for

            codec = codec_for(GGML_TYPE_TO_FORMAT[tensor.ggml_type], "gguf_blocks_v1")
            return codec.decode(blocks.reshape(-1), (tensor.rows, tensor.ne[0]))
        from gguf.quants import dequantize

        with np.errstate(all="ignore"):  # NaN/Inf block scales propagate; inspect flags them
            return dequantize(blocks, GGMLQuantizationType(tensor.ggml_type))

    def provenance(self) -> dict[str, Any]:
        files = {}
        for path, reader in self._parts:
            header = bytes(reader.data[: int(reader.data_offset)])
            files[path.name] = {
                "bytes": int(reader.data.shape[0]),
                "header_xxh3_64": xxh3_hex(header),
            }
        return {
            "kind": "gguf",
            "path": str(self.path),
            "repo_id": None,
            "revision": None,
            "commit": None,
            "architecture": self.architecture,
            "files": files,
        }

    def __repr__(self) -> str:
        return f"GgufSource({self.id!r}, {len(self._keys)} tensors)"
