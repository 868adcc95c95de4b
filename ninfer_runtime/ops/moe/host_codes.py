"""Stored weights as the host's int4 products read them (``host_int4``): each value
``w = s · q + o``, a signed code ``q`` with a scale ``s`` and an offset ``o`` per group of 32
or 64 columns.

* ``row_split_k128_v1`` (q4/q5/q6 in groups of 64, q8 in groups of 32): ``ninfer_format``'s
  unpacking, binary16 scales, no offset;
* GGUF's ``Q4_0`` and ``Q8_0`` (blocks of 32: a binary16 scale, then the codes; Q4_0's value
  ``j`` is the low nibble of byte ``j`` and value ``j + 16`` the high one, less 8): no offset;
* GGUF's ``Q4_K`` and ``Q5_K`` (super-blocks of 256 in 8 groups of 32: ``w = d·sc·u -
  dmin·m`` for an unsigned code ``u``, the 6-bit ``sc`` and ``m`` unpacked by gguf's own
  ``get_scale_min``): ``q = u - 2^(b-1)``, so ``s = d·sc`` and ``o = 2^(b-1)·s - dmin·m``.

Every other format answers None (the reference's way).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf.quants import Q4_K

from ninfer_format.codecs.gguf_block_types import FORMAT_BLOCKS
from ninfer_format.codecs.gguf_blocks import LAYOUT as GGUF_LAYOUT
from ninfer_format.codecs.row_split import unpack_row_split

__all__ = ["FORMATS", "Codes", "codes_of"]

ROW_SPLIT = "row_split_k128_v1"
#: the formats read -> (layout, code bits, columns a group)
FORMATS = {
    "q4_g64_fp16": (ROW_SPLIT, 4, 64),
    "q5_g64_fp16": (ROW_SPLIT, 5, 64),
    "q6_g64_fp16": (ROW_SPLIT, 6, 64),
    "q8_g32_fp16": (ROW_SPLIT, 8, 32),
    "gguf_q4_0": (GGUF_LAYOUT, 4, 32),
    "gguf_q8_0": (GGUF_LAYOUT, 8, 32),
    "gguf_q4_k": (GGUF_LAYOUT, 4, 32),
    "gguf_q5_k": (GGUF_LAYOUT, 5, 32),
}

#: signed codes [N, K] (int8), scales [N, groups] and offsets [N, groups] or None (float32)
Codes = tuple[np.ndarray, np.ndarray, np.ndarray | None]


def codes_of(piece: Any) -> Codes:
    """A stored piece's (``format``, ``layout``, ``data``, ``shape``) codes, scales and
    offsets; its format must be one of ``FORMATS``, in that format's layout."""
    rows, columns = (int(d) for d in piece.shape)
    if piece.layout == ROW_SPLIT:
        codes, words = unpack_row_split(piece.format, piece.data, (rows, columns))
        return codes, words.view(np.float16).astype(np.float32), None
    _, values, nbytes = FORMAT_BLOCKS[piece.format]
    blocks = piece.data.reshape(-1, nbytes)
    d = blocks[:, :2].view(np.float16).astype(np.float32)  # [blocks, 1]
    if piece.format == "gguf_q8_0":
        codes, scales, offsets = blocks[:, 2:].view(np.int8), d, None
    elif piece.format == "gguf_q4_0":
        body = blocks[:, 2:]
        codes = np.concatenate([body & 15, body >> 4], axis=-1).astype(np.int8) - 8
        scales, offsets = d, None
    else:
        codes, scales, offsets = _k_quant(piece.format, blocks, d, values)
    groups = columns // 32
    return (
        codes.reshape(rows, columns),
        scales.reshape(rows, groups),
        None if offsets is None else offsets.reshape(rows, groups),
    )


def _k_quant(
    fmt: str, blocks: np.ndarray, d: np.ndarray, values: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K's or Q5_K's codes [blocks, 256], scales and offsets [blocks, 8]."""
    n = blocks.shape[0]
    dmin = blocks[:, 2:4].view(np.float16).astype(np.float32)
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])
    low_at = 16 if fmt == "gguf_q4_k" else 48
    nibbles = blocks[:, low_at:].reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8)[:, None]
    unsigned = (nibbles & 15).reshape(n, 8, 32)
    bits = 4
    if fmt == "gguf_q5_k":  # the fifth bit of group g's value l: bit g of byte l of qh
        high = blocks[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8)[:, None]
        unsigned = unsigned | ((high & 1) << 4)
        bits = 5
    half = 1 << (bits - 1)
    scales = d * sc.astype(np.float32)
    offsets = half * scales - dmin * m.astype(np.float32)
    codes = (unsigned.astype(np.int16) - half).astype(np.int8).reshape(n, values)
    return codes, scales, offsets
