"""A GGUF file (llama.cpp's single-file checkpoint format) as a tensor source.

Two uses drive the interface. A recipe that keeps llama.cpp's blocks verbatim (``gguf_*``
formats, layout ``gguf_blocks_v1``) needs ``raw_blocks``: the stored bytes as
``[rows, row_bytes]``, rows being every dimension but the innermost. A recipe that re-quantizes,
or that transforms a tensor (norm offsets, head order), needs ``load``: float32 values.

The header and tensor table (and the parts of a split GGUF) are read by ``gguf_table``; the
types, their block sizes and their values by ``ggml_types``. Shapes are reported in
NInfer/torch order (outermost first), i.e. ggml's ``ne`` reversed.

A recipe that keeps blocks copies them without the memory map: ``block_range`` says where a
run of rows lies, ``read_into`` fills a caller's buffer from the file (``gguf_reads``).

Provenance records the file size and the xxh3-64 of everything before the tensor data (header,
key/values and tensor table), for the same reason as for safetensors: hashing the data would
read a multi-gigabyte file twice.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import SourceError
from .base import TensorSource, missing_tensor, xxh3_hex
from .ggml_types import decode_values, ggml_type_name
from .gguf_reads import PartReads
from .gguf_table import SPLIT_NAME, TableEntry, field, open_reader, read_tensor_table, split_parts

if TYPE_CHECKING:
    import torch

__all__ = ["SPLIT_NAME", "GgufSource", "ggml_type_name"]


class GgufSource(TensorSource):
    """Tensors and key/value metadata of one GGUF file (memory-mapped, read-only), or of a
    split GGUF given its first part."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser().absolute()
        self.id = str(self.path)
        reader = open_reader(self.path)
        self._reader = reader
        self.version = int(reader.fields["GGUF.version"].parts[0][0])
        self._parts = split_parts(self.path, reader)
        self._tensors: dict[str, TableEntry] = {}
        for index, (part, part_reader) in enumerate(self._parts):
            read_tensor_table(index, part, part_reader, self._tensors)
        total = field(reader, "split.tensors.count")
        if total is not None and int(total) != len(self._tensors):
            raise SourceError(
                f"{self.path}: the split GGUF lists {int(total)} tensors, its parts hold "
                f"{len(self._tensors)}"
            )
        self._keys = sorted(self._tensors)
        self._reads = PartReads([path for path, _ in self._parts])

    # -- metadata ----------------------------------------------------------------------------

    @cached_property
    def metadata(self) -> dict[str, Any]:
        """Every key/value of the header (strings decoded, arrays as lists), in file order.

        Built on first use: ``tokenizer.ggml.tokens`` and ``.merges`` run to hundreds of
        thousands of strings, which a pure tensor-copying recipe never needs.
        """
        values: dict[str, Any] = {}
        for key, entry in self._reader.fields.items():
            if key.startswith("GGUF."):
                continue  # the reader's pseudo-fields: version and counts
            try:
                values[key] = entry.contents()
            except Exception as exc:
                raise SourceError(
                    f"{self.path}: cannot decode metadata key {key!r}: {exc}"
                ) from exc
        return values

    def get(self, key: str, default: Any = None) -> Any:
        """One metadata value, without decoding the large tokenizer arrays."""
        entry = self._reader.fields.get(key)
        if entry is None:
            return default
        try:
            return entry.contents()
        except Exception as exc:
            raise SourceError(f"{self.path}: cannot decode metadata key {key!r}: {exc}") from exc

    @property
    def architecture(self) -> str | None:
        """``general.architecture`` ("qwen35", "qwen35moe", ...), or None if absent."""
        value = self.get("general.architecture")
        return value if isinstance(value, str) else None

    # -- tensors -----------------------------------------------------------------------------

    def _entry(self, name: str) -> TableEntry:
        tensor = self._tensors.get(name)
        if tensor is None:
            raise missing_tensor(name, self.id, self._keys)
        return tensor

    def _blocked(self, name: str) -> TableEntry:
        """The entry of a tensor whose bytes can be cut into rows (its block size is known)."""
        tensor = self._entry(name)
        if tensor.block is None:
            raise SourceError(
                f"{self.id}: tensor {name!r} has ggml type {tensor.ggml_type}, whose block size "
                "is unknown to gguf-py and to ninfer_format"
            )
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
        tensor = self._blocked(name)
        size = tensor.rows * tensor.row_bytes
        data = self._parts[tensor.part][1].data[tensor.offset : tensor.offset + size]
        return data.reshape(tensor.rows, tensor.row_bytes)

    def block_range(self, name: str, start: int, stop: int) -> tuple[int, int, int]:
        """Where rows ``[start, stop)`` of ``raw_blocks(name)`` lie: (part, byte offset, bytes)."""
        tensor = self._blocked(name)
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
        self._reads.read_into(part, offset, view)

    def load(self, name: str) -> torch.Tensor:
        """Values as float32 (integer types keep their integer dtype, F64 stays float64).

        Quantized types are dequantized with gguf-py's reference dequantizers, Q2_0 with the
        ``gguf_q2_0`` codec; the result has ``shape(name)``.
        """
        import torch

        tensor = self._entry(name)
        blocks = self.raw_blocks(name)
        try:
            values = decode_values(tensor.ggml_type, blocks, tensor.ne)
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
