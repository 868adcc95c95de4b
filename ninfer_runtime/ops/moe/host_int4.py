"""The moe family's ``host_products`` provider ``torch_int4``: the products of routed experts
held in host memory (expert offload) on torch's CPU int4 kernel
(``aten._weight_int4pack_mm_for_cpu``), which reads 4-bit codes with a scale per group of 64
inside the product: one pass over the codes, on the cores it is given, where the reference
decodes them to float32 first and multiplies after.

A ``q4_g64_fp16`` weight is repacked once, at load, into the kernel's layout: each code ``q``
stored as ``q + 8`` with the group's scale and a zero point of 0 (the kernel computes
``(u - 8) · scale + zero``), so a weight is exactly the stored one, up to its scale rounded
from binary16 to bf16. Activations go in as bf16 and the kernel accumulates in float32: the
production precision of the GPU path whose host share this is (float32 activations take the
kernel's slow path). The kernel needs rows in multiples of 16 and whole groups of 64
columns; a weight that is not q4, or is stored otherwise, stays with the reference (``pack``
answers None).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ninfer_format.codecs.row_split import unpack_row_split

__all__ = ["FORMAT", "GROUP", "Int4Weight", "TorchInt4", "accepts", "host_products"]

#: the stored form the kernel reads (codes with a binary16 scale per group of 64 columns)
FORMAT, LAYOUT, GROUP = "q4_g64_fp16", "row_split_k128_v1", 64
#: the kernel's row multiple
ROWS = 16
#: the code offset: the kernel reads unsigned codes u and computes (u - 8) · scale + zero
OFFSET = 8


@dataclass(frozen=True)
class Int4Weight:
    """A ``[rows, columns]`` weight in the kernel's layout: ``packed`` uint8 codes, ``scales``
    bf16 ``[columns / 64, rows, 2]`` (each group's scale and a zero point of 0)."""

    packed: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes


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
        (another format or layout, input columns stored in another order, rows not a
        multiple of 16, columns not whole groups)."""
        if columns is not None or not pieces:
            return None
        if any(p.format != FORMAT or p.layout != LAYOUT for p in pieces):
            return None
        width = int(pieces[0].shape[1])
        rows = sum(int(p.shape[0]) for p in pieces)
        if width % GROUP or rows % ROWS or any(int(p.shape[1]) != width for p in pieces):
            return None
        parts = [unpack_row_split(FORMAT, p.data, tuple(p.shape)) for p in pieces]
        codes = np.concatenate([c for c, _ in parts]).astype(np.int32) + OFFSET
        scales = np.concatenate([s for _, s in parts]).view(np.float16).astype(np.float32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(codes), 1)
        scale = torch.from_numpy(np.ascontiguousarray(scales.T))
        pairs = torch.stack([scale, torch.zeros_like(scale)], dim=-1).to(torch.bfloat16)
        return Int4Weight(packed, pairs.contiguous(), (rows, width))

    @staticmethod
    def linear(x: np.ndarray, w: Int4Weight) -> np.ndarray:
        """``x @ w.T`` for rows x [n, columns], float32 in and out (bf16 into the kernel)."""
        rows = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, w.packed, GROUP, w.scales)
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
