"""EXT-ALL ``gguf_*`` formats in layout ``gguf_blocks_v1``: ggml quantization blocks kept verbatim.

An artifact converted from a GGUF file can keep llama.cpp's blocks byte for byte instead of
re-quantizing them (spec §6.1). A tensor ``[N, K]`` is N rows, each ``K / values_per_block``
ggml blocks in order, with no planes and no padding. Values mean exactly what ggml's
``dequantize_row_*`` makes of them, so decoding defers to gguf-py's dequantizers (the Python
reference implementation of ggml) for every type it knows; only ``Q2_0`` (ggml type 42), which
gguf-py predates, is decoded here (``gguf_block_types``, with the block types' table).

gguf is imported inside the functions: importing ``ninfer_format`` must stay cheap, and only
artifacts that actually hold ``gguf_*`` objects need it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import CodecError
from .gguf_block_types import (
    _BLOCK_TYPES,
    _IQ1_M_TYPE,
    _Q2_0_TYPE,
    _BlockType,
    _dequantize_q2_0,
    _f16_bits,
    _iq1_m_scale,
)

# re-exported: the converter, the CUDA backend, the bench and the tests name them through here
from .gguf_block_types import FORMAT_BLOCKS as FORMAT_BLOCKS
from .gguf_block_types import GGML_TYPE_TO_FORMAT as GGML_TYPE_TO_FORMAT
from .gguf_block_types import set_scales as set_scales
from .registry import Finding, Profile, register

if TYPE_CHECKING:
    from types import ModuleType

LAYOUT = "gguf_blocks_v1"
ALIGNMENT = 256

#: Decode/scan this many values' worth of blocks at a time, so temporaries stay near 64 MB of
#: float32 however large the tensor is.
_CHUNK_VALUES = 1 << 24
#: gguf-py processes 16 rows per numpy pass; feeding it rows of this many values (a multiple of
#: every block size) keeps each pass large enough that Python overhead does not dominate.
_ROW_VALUES = 16384

_F16_EXP_MASK = 0x7C00  # all-ones exponent = Inf or NaN

#: gguf-py can quantize these (when the installed version implements them); the rest must be
#: imported from a GGUF file, since writing K-/I-quant blocks needs llama.cpp's quantizers.
_ENCODABLE = frozenset({"gguf_q4_0", "gguf_q5_0", "gguf_q8_0", "gguf_iq4_nl"})


def _gguf_quants(fmt: str, action: str) -> ModuleType:
    try:
        import gguf.quants
    except ImportError as exc:
        raise CodecError(f"{action} {fmt} needs the gguf package (pip install gguf)") from exc
    return gguf.quants


class GgufBlockCodec:
    """One ``gguf_*`` format: ggml blocks verbatim, rows in order."""

    layout = LAYOUT
    alignment = ALIGNMENT
    profile: Profile = "EXT-ALL"
    decoded_dtype = np.dtype(np.float32)

    def __init__(self, block_type: _BlockType) -> None:
        self._bt = block_type
        self.format = block_type.format
        self.ggml_type = block_type.ggml_type
        self.block_values = block_type.block_values
        self.block_bytes = block_type.block_bytes
        self.bits_per_weight = 8.0 * block_type.block_bytes / block_type.block_values

    def __repr__(self) -> str:
        return f"GgufBlockCodec({self.format!r}, ggml type {self.ggml_type})"

    # -- geometry ---------------------------------------------------------------------------

    def _reject(self, shape: tuple[int, ...], rule: str) -> CodecError:
        return CodecError(f"{self.format}/{self.layout}: shape {list(shape)} invalid: {rule}")

    def check_shape(self, shape: tuple[int, ...], divisors: int = 1) -> None:
        shape = tuple(shape)
        if divisors != 1:
            raise self._reject(shape, f"divisors must be 1 (got {divisors}); only nvfp4 uses more")
        if len(shape) != 2:
            raise self._reject(shape, "gguf_blocks_v1 needs rank 2 [N, K]")
        if any(not isinstance(dim, int | np.integer) or dim <= 0 for dim in shape):
            raise self._reject(shape, "dimensions must be positive integers")
        if shape[1] % self.block_values:
            raise self._reject(
                shape, f"K={shape[1]} must be a multiple of {self.block_values} values per block"
            )

    def encoded_size(self, shape: tuple[int, ...], divisors: int = 1) -> int:
        self.check_shape(shape, divisors)
        n, k = (int(dim) for dim in shape)
        return n * (k // self.block_values) * self.block_bytes

    def _blocks(self, data: Any, shape: tuple[int, ...], divisors: int) -> np.ndarray:
        """``data`` as a ``[n_blocks, block_bytes]`` view, after checking its type and length."""
        expected = self.encoded_size(shape, divisors)
        if isinstance(data, bytes | bytearray | memoryview):
            data = np.frombuffer(data, dtype=np.uint8)
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 1:
            what = (
                f"{data.dtype}{list(data.shape)}"
                if isinstance(data, np.ndarray)
                else type(data).__name__
            )
            raise CodecError(f"{self.format}/{self.layout}: data must be 1-D uint8, got {what}")
        if data.size != expected:
            raise CodecError(
                f"{self.format}/{self.layout}: shape {list(shape)} needs {expected} bytes, "
                f"object has {data.size}"
            )
        return data.reshape(-1, self.block_bytes)

    def _chunks(self, n_blocks: int) -> Iterator[tuple[int, int]]:
        step = max(1, _CHUNK_VALUES // self.block_values)
        for start in range(0, n_blocks, step):
            yield start, min(start + step, n_blocks)

    # -- decode -----------------------------------------------------------------------------

    def decode(self, data: np.ndarray, shape: tuple[int, ...], divisors: int = 1) -> np.ndarray:
        blocks = self._blocks(data, shape, divisors)
        out = np.empty(blocks.shape[0] * self.block_values, dtype=np.float32)
        dequantize = self._dequantizer()
        # NaN/Inf scales are scan's business; decoding just propagates them, quietly.
        with np.errstate(all="ignore"):
            for start, stop in self._chunks(blocks.shape[0]):
                values = dequantize(blocks[start:stop])
                out[start * self.block_values : stop * self.block_values] = values.reshape(-1)
        return out.reshape(tuple(int(dim) for dim in shape))

    def _dequantizer(self) -> Any:
        """A function from ``[n, block_bytes]`` uint8 blocks to their float32 values."""
        if self.ggml_type == _Q2_0_TYPE:
            return _dequantize_q2_0
        quants = _gguf_quants(self.format, "decoding")
        try:
            qtype = quants.GGMLQuantizationType(self.ggml_type)
        except ValueError as exc:
            raise CodecError(
                f"decoding {self.format} needs a gguf package that knows ggml type {self.ggml_type}"
            ) from exc
        per_row = _ROW_VALUES // self.block_values

        def dequantize(blocks: np.ndarray) -> np.ndarray:
            # Blocks are independent, so regroup them into rows of a size gguf-py handles well.
            n = blocks.shape[0]
            whole = n - n % per_row
            parts = []
            try:
                if whole:
                    rows = blocks[:whole].reshape(whole // per_row, per_row * self.block_bytes)
                    parts.append(quants.dequantize(rows, qtype).reshape(-1))
                if n > whole:
                    tail = blocks[whole:].reshape(1, (n - whole) * self.block_bytes)
                    parts.append(quants.dequantize(tail, qtype).reshape(-1))
            except Exception as exc:
                raise CodecError(f"gguf could not dequantize {self.format}: {exc}") from exc
            return parts[0] if len(parts) == 1 else np.concatenate(parts)

        return dequantize

    # -- encode -----------------------------------------------------------------------------

    def encode(self, values: np.ndarray, divisors: int = 1) -> bytes:
        values = np.asarray(values)
        self.check_shape(values.shape, divisors)
        no_encoder = CodecError(f"no encoder for {self.format}; import blocks from a GGUF file")
        if self.format not in _ENCODABLE:
            raise no_encoder
        quants = _gguf_quants(self.format, "encoding")
        values = values.astype(np.float32, copy=False)
        if not np.isfinite(values).all():
            raise CodecError(f"{self.format}: cannot encode non-finite values")
        qtype = quants.GGMLQuantizationType(self.ggml_type)
        rows_per_chunk = max(1, _CHUNK_VALUES // values.shape[1])
        out = bytearray()
        for start in range(0, values.shape[0], rows_per_chunk):
            try:
                encoded = quants.quantize(values[start : start + rows_per_chunk], qtype)
            except NotImplementedError as exc:
                raise no_encoder from exc
            except Exception as exc:
                raise CodecError(f"gguf could not quantize {self.format}: {exc}") from exc
            out += np.ascontiguousarray(encoded, dtype=np.uint8).tobytes()
        return bytes(out)

    # -- scan -------------------------------------------------------------------------------

    def scan(self, data: np.ndarray, shape: tuple[int, ...], divisors: int = 1) -> list[Finding]:
        """NaN/Inf block scales, one finding per scale field (every code word is legal)."""
        blocks = self._blocks(data, shape, divisors)
        if self.ggml_type == _IQ1_M_TYPE:
            fields: list[tuple[str, Any]] = [("assembled d", _iq1_m_scale)]
        else:
            fields = [
                (name, lambda b, off=offset: _f16_bits(b, off))
                for name, offset in self._bt.f16_fields
            ]
        n_blocks = blocks.shape[0]
        blocks_per_row = int(shape[1]) // self.block_values
        findings = []
        for name, read in fields:
            count, first = 0, -1
            for start, stop in self._chunks(n_blocks):
                bad = (read(blocks[start:stop]) & np.uint16(_F16_EXP_MASK)) == _F16_EXP_MASK
                hits = int(np.count_nonzero(bad))
                if hits and first < 0:
                    first = start + int(np.argmax(bad))
                count += hits
            if count:
                findings.append(
                    Finding(
                        "error",
                        f"{self.format}: {count} of {n_blocks} blocks have a NaN or Inf "
                        f"`{name}` scale (first: block {first}, row {first // blocks_per_row})",
                    )
                )
        return findings


CODECS: dict[str, GgufBlockCodec] = {}
for _bt in _BLOCK_TYPES:
    CODECS[_bt.format] = GgufBlockCodec(_bt)
    register(CODECS[_bt.format])
del _bt
