"""The moe family's ``host_products`` provider ``torch_int4``: the products of routed experts
held in host memory (expert offload) on torch's CPU int4 kernel
(``aten._weight_int4pack_mm_for_cpu``), which reads 4-bit codes with a scale and a zero point
per group of columns inside the product: one pass over the codes, on the cores it is given,
where the reference decodes them to float32 first and multiplies after.

A weight in a grouped integer format (``q4_g64_fp16``, ``q5_g64_fp16``, ``q6_g64_fp16``,
``q8_g32_fp16``, and GGUF's ``gguf_q4_0`` and ``gguf_q8_0``, whose blocks of 32 are a signed
code times a binary16 scale too) is repacked once, at load, into the kernel's layout. The
kernel computes ``(c - 8) · scale + zero`` for a 4-bit code ``c``. With ``u = q + 2^(b-1)``
a wider code's unsigned value (``q`` its stored value, ``s`` its group's scale):

* q4: one plane, ``c = u``, scale ``s``, zero 0;
* q5, q6, q8: two planes side by side along the columns, the product's rows given twice:
  the low nibble ``c = u & 15`` with scale ``s`` and zero ``8s``, and the high bits
  ``c = (u >> 4) + 8`` (q8: ``u >> 4``) with scale ``16s`` and zero ``-2^(b-1)·s`` (q8: 0).
  The planes add up to ``s·u - 2^(b-1)·s = s·q``, and every scale and zero is ``s`` times a
  power of two, so bf16 holds them as it holds ``s``.

So a weight is exactly the stored one, up to its scale rounded from binary16 to bf16; a q5
weight reads 1.13 bytes and a q8 weight 1.25, against 0.66 and 1.06 stored (q4: 0.56 and 0.53).
Activations go in as bf16 and the kernel accumulates in float32: the production precision of
the GPU path whose host share this is (float32 activations take the kernel's slow path). The
kernel needs rows in multiples of 16 and whole groups; a weight it cannot read stays with the
reference (``pack`` answers None).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ninfer_format.codecs.gguf_blocks import LAYOUT as GGUF_LAYOUT
from ninfer_format.codecs.row_split import unpack_row_split

__all__ = ["FORMATS", "Int4Weight", "TorchInt4", "accepts", "host_products"]

#: the stored formats the kernel reads -> (layout, code bits, group of columns a scale covers)
FORMATS = {
    "q4_g64_fp16": ("row_split_k128_v1", 4, 64),
    "q5_g64_fp16": ("row_split_k128_v1", 5, 64),
    "q6_g64_fp16": ("row_split_k128_v1", 6, 64),
    "q8_g32_fp16": ("row_split_k128_v1", 8, 32),
    "gguf_q4_0": (GGUF_LAYOUT, 4, 32),
    "gguf_q8_0": (GGUF_LAYOUT, 8, 32),
}
#: bytes of a GGUF block of 32: its binary16 scale, then the codes
GGUF_BLOCK_BYTES = {"gguf_q4_0": 18, "gguf_q8_0": 34}
#: the kernel's row multiple
ROWS = 16
#: the code offset: the kernel reads a code c as c - 8
OFFSET = 8


@dataclass(frozen=True)
class Int4Weight:
    """A ``[rows, columns]`` weight in the kernel's layout: ``packed`` uint8 codes of
    ``planes`` planes side by side, ``scales`` bf16 ``[planes · columns / group, rows, 2]``
    (each group's scale and zero point)."""

    packed: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, int]
    group: int
    planes: int

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes


def _codes_and_scales(piece: Any) -> tuple[np.ndarray, np.ndarray]:
    """A stored piece's signed codes ``[N, K]`` and scale words ``[N, groups]`` (uint16,
    binary16 bits)."""
    if piece.layout != GGUF_LAYOUT:
        return unpack_row_split(piece.format, piece.data, tuple(piece.shape))
    rows, columns = (int(d) for d in piece.shape)
    blocks = piece.data.reshape(rows, columns // 32, GGUF_BLOCK_BYTES[piece.format])
    scales = np.ascontiguousarray(blocks[..., :2]).view(np.uint16)[..., 0]
    body = blocks[..., 2:]
    if piece.format == "gguf_q8_0":
        return body.view(np.int8).reshape(rows, columns), scales
    # q4_0: value j of a block is the low nibble of byte j, value j + 16 the high one, less 8
    codes = np.concatenate([body & 15, body >> 4], axis=-1).astype(np.int8) - 8
    return codes.reshape(rows, columns), scales


def _planes(bits: int, codes: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's codes ``[N, planes · K]`` (int32, 0..15) and scale and zero
    ``[planes · groups, N, 2]`` (float32) of stored ``codes`` [N, K] and scales [N, groups]."""
    s = scales.T  # [groups, N]
    if bits == 4:
        return codes.astype(np.int32) + OFFSET, np.stack([s, np.zeros_like(s)], axis=-1)
    unsigned = codes.astype(np.int32) + (1 << (bits - 1))
    high = unsigned >> 4
    if bits < 8:
        high += OFFSET
    low_pairs = np.stack([s, 8 * s], axis=-1)
    high_zero = np.zeros_like(s) if bits == 8 else -float(1 << (bits - 1)) * s
    high_pairs = np.stack([16 * s, high_zero], axis=-1)
    return (
        np.concatenate([unsigned & 15, high], axis=1),
        np.concatenate([low_pairs, high_pairs], axis=0),
    )


class TorchInt4:
    """What a host expert's math calls as its backend (``linear``), and how its weights are
    made ready for it (``pack``)."""

    name = "torch_int4"

    def __init__(self) -> None:
        self._threads = threading.local()

    @staticmethod
    def pack(pieces: Sequence[Any], columns: np.ndarray | None) -> Int4Weight | None:
        """A weight stored as ``pieces`` (stored rows in order: ``format``, ``layout``,
        ``data``, ``shape``) in the kernel's layout; None where the kernel cannot read it
        (another format or layout, formats mixed, input columns stored in another order,
        rows not a multiple of 16, columns not whole groups)."""
        if columns is not None or not pieces:
            return None
        fmt = pieces[0].format
        if fmt not in FORMATS:
            return None
        layout, bits, group = FORMATS[fmt]
        if any(p.format != fmt or p.layout != layout for p in pieces):
            return None
        width = int(pieces[0].shape[1])
        rows = sum(int(p.shape[0]) for p in pieces)
        if width % group or rows % ROWS or any(int(p.shape[1]) != width for p in pieces):
            return None
        parts = [_codes_and_scales(p) for p in pieces]
        scales = np.concatenate([s for _, s in parts]).view(np.float16).astype(np.float32)
        codes, pairs = _planes(bits, np.concatenate([c for c, _ in parts]), scales)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(codes), 1)
        zeros = torch.from_numpy(np.ascontiguousarray(pairs)).to(torch.bfloat16)
        return Int4Weight(packed, zeros, (rows, width), group, codes.shape[1] // width)

    @staticmethod
    def linear(x: np.ndarray, w: Int4Weight) -> np.ndarray:
        """``x @ w.T`` for rows x [n, columns], float32 in and out (bf16 into the kernel;
        the rows given once a plane)."""
        rows = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)
        if w.planes > 1:
            rows = rows.repeat(1, w.planes)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, w.packed, w.group, w.scales)
        return out.float().numpy()

    def use_threads(self, threads: int) -> None:
        """The cores the calling thread's products may take (torch's count is per thread:
        experts computed side by side share the cores out)."""
        if getattr(self._threads, "count", None) != threads:
            torch.set_num_threads(threads)
            self._threads.count = threads


_KERNEL = TorchInt4()


def host_products() -> TorchInt4:
    return _KERNEL


def accepts(**_: object) -> bool:
    """Beside any engine device (the policy keeps it off the CPU backend's, whose host share
    is the float32 oracle's)."""
    return True
