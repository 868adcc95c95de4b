"""ggml's quantization block types as ``gguf_blocks`` stores them: each one's ggml type id,
values and bytes per block, and where its binary16 scale fields sit (ggml-common.h's block
structs); the reads and writes of those scale fields, and ``Q2_0``'s dequantizer (gguf-py
predates ggml type 42)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
