"""EXT-ALL ``gguf_*`` formats in layout ``gguf_blocks_v1``: ggml quantization blocks kept verbatim.

An artifact converted from a GGUF file can keep llama.cpp's blocks byte for byte instead of
re-quantizing them (spec §6.1). A tensor ``[N, K]`` is N rows, each ``K / values_per_block``
ggml blocks in order, with no planes and no padding. Values mean exactly what ggml's
``dequantize_row_*`` makes of them, so decoding defers to gguf-py's dequantizers (the Python
reference implementation of ggml) for every type it knows; only ``Q2_0`` (ggml type 42), which
gguf-py predates, is decoded here.

gguf is imported inside the functions: importing ``ninfer_format`` must stay cheap, and only
artifacts that actually hold ``gguf_*`` objects need it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import CodecError
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


@dataclass(frozen=True)
class _BlockType:
    """One ggml block type: id, geometry, and where its f16 scale fields sit in a block."""

    format: str
    ggml_type: int
    block_values: int
    block_bytes: int
    #: (field name, byte offset) of every binary16 scale field; see ``_iq1_m_scale`` for iq1_m
    f16_fields: tuple[tuple[str, int], ...]


# Offsets follow ggml-common.h's block structs (spec §6.1 table). All 18 types have their block
# scales checked by ``scan``: 17 store them as plain f16 fields, iq1_m assembles its one.
_D0 = (("d", 0),)
_BLOCK_TYPES: tuple[_BlockType, ...] = (
    _BlockType("gguf_q4_0", 2, 32, 18, _D0),
    _BlockType("gguf_q5_0", 6, 32, 22, _D0),
    _BlockType("gguf_q8_0", 8, 32, 34, _D0),
    _BlockType("gguf_q2_k", 10, 256, 84, (("d", 80), ("dmin", 82))),
    _BlockType("gguf_q3_k", 11, 256, 110, (("d", 108),)),
    _BlockType("gguf_q4_k", 12, 256, 144, (("d", 0), ("dmin", 2))),
    _BlockType("gguf_q5_k", 13, 256, 176, (("d", 0), ("dmin", 2))),
    _BlockType("gguf_q6_k", 14, 256, 210, (("d", 208),)),
    _BlockType("gguf_iq2_xxs", 16, 256, 66, _D0),
    _BlockType("gguf_iq2_xs", 17, 256, 74, _D0),
    _BlockType("gguf_iq3_xxs", 18, 256, 98, _D0),
    _BlockType("gguf_iq1_s", 19, 256, 50, _D0),
    _BlockType("gguf_iq4_nl", 20, 32, 18, _D0),
    _BlockType("gguf_iq3_s", 21, 256, 110, _D0),
    _BlockType("gguf_iq2_s", 22, 256, 82, _D0),
    _BlockType("gguf_iq4_xs", 23, 256, 136, _D0),
    _BlockType("gguf_iq1_m", 29, 256, 56, ()),
    _BlockType("gguf_q2_0", 42, 64, 18, _D0),
)

#: ggml type id -> our format name, for the converter's GGUF importer.
GGML_TYPE_TO_FORMAT: dict[int, str] = {bt.ggml_type: bt.format for bt in _BLOCK_TYPES}
#: format name -> (ggml type id, values per block, bytes per block).
FORMAT_BLOCKS: dict[str, tuple[int, int, int]] = {
    bt.format: (bt.ggml_type, bt.block_values, bt.block_bytes) for bt in _BLOCK_TYPES
}

_Q2_0_TYPE = 42
_IQ1_M_TYPE = 29
_IQ1_M_SCALES_OFFSET = 48
#: gguf-py can quantize these (when the installed version implements them); the rest must be
#: imported from a GGUF file, since writing K-/I-quant blocks needs llama.cpp's quantizers.
_ENCODABLE = frozenset({"gguf_q4_0", "gguf_q5_0", "gguf_q8_0", "gguf_iq4_nl"})


def _gguf_quants(fmt: str, action: str) -> ModuleType:
    try:
        import gguf.quants
    except ImportError as exc:
        raise CodecError(f"{action} {fmt} needs the gguf package (pip install gguf)") from exc
    return gguf.quants


def _f16_bits(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The little-endian u16 word at ``offset`` of every block (rows of ``blocks``): a strided
    view, no copy (a scan of the scales then reads each block's two bytes once)."""
    return blocks[:, offset : offset + 2].view("<u2")[:, 0]


def _iq1_m_scale(blocks: np.ndarray) -> np.ndarray:
    """iq1_m has no ``d`` field: its f16 scale is the top nibble of each of four u16 words."""
    words = [_f16_bits(blocks, _IQ1_M_SCALES_OFFSET + 2 * i) for i in range(4)]
    return (
        (words[0] >> np.uint16(12))
        | ((words[1] >> np.uint16(8)) & np.uint16(0x00F0))
        | ((words[2] >> np.uint16(4)) & np.uint16(0x0F00))
        | (words[3] & np.uint16(0xF000))
    )


def set_scales(fmt: str, blocks: np.ndarray, bits: np.ndarray) -> None:
    """Write the binary16 words ``bits`` (one per block) into every scale field of
    ``blocks`` (uint8 ``[n, block_bytes]``, in place): d and dmin where a type has both;
    iq1_m's scale spread over the top nibbles of its four ``scales`` words."""
    bits = np.asarray(bits, dtype=np.uint16)
    if fmt == "gguf_iq1_m":
        for i in range(4):
            hi = _IQ1_M_SCALES_OFFSET + 2 * i + 1  # high byte of little-endian word i
            nibble = ((bits >> np.uint16(4 * i)) & np.uint16(0xF)).astype(np.uint8)
            blocks[:, hi] = (blocks[:, hi] & np.uint8(0x0F)) | (nibble << np.uint8(4))
        return
    block_type = next(bt for bt in _BLOCK_TYPES if bt.format == fmt)
    for _, offset in block_type.f16_fields:
        blocks[:, offset] = (bits & np.uint16(0xFF)).astype(np.uint8)
        blocks[:, offset + 1] = (bits >> np.uint16(8)).astype(np.uint8)


def _dequantize_q2_0(blocks: np.ndarray) -> np.ndarray:
    """ggml Q2_0: 64 two-bit codes per block, ``w[j] = (code_j - 1) * d``, 4 codes per byte."""
    d = _f16_bits(blocks, 0).view(np.float16).astype(np.float32)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)
    codes = (blocks[:, 2:18, None] >> shifts) & np.uint8(3)  # [n, byte, lane]: j = 4*byte + lane
    q = codes.reshape(blocks.shape[0], 64).astype(np.float32) - np.float32(1)
    return q * d[:, None]


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
