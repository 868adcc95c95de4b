"""The moe family's ``host_products`` provider ``torch_int4``: the products of routed experts
held in host memory (expert offload) on torch's CPU int4 kernel
(``aten._weight_int4pack_mm_for_cpu``), which reads 4-bit codes with a scale and a zero point
per group of columns inside the product: one pass over the codes, on the cores it is given,
where the reference decodes them to float32 first and multiplies after.

A weight in a format ``host_codes`` reads (q4/q5/q6/q8 and GGUF's Q4_0, Q8_0, Q4_K, Q5_K:
each value ``s·q + o``, a signed code of ``b`` bits with a scale and an offset a group) is
repacked once, at load, into the kernel's layout. The kernel computes ``(c - 8) · scale +
zero`` for a 4-bit code ``c``. With ``u = q + 2^(b-1)`` the code's unsigned value:

* 4 bits: one plane, ``c = u``, scale ``s``, zero ``o``;
* 5, 6, 8 bits: two planes side by side along the columns, the product's rows given twice:
  the low nibble ``c = u & 15`` with scale ``s`` and zero ``8s + o``, and the high bits
  ``c = (u >> 4) + 8`` (8 bits: ``u >> 4``) with scale ``16s`` and zero ``-2^(b-1)·s``
  (8 bits: 0). The planes add up to ``s·u - 2^(b-1)·s + o = s·q + o``.

Where there is no offset (all but the K-quants) every scale and zero is ``s`` times a power of
two, which bf16 holds as it holds ``s``: a weight is exactly the stored one, up to its scale
rounded from binary16 to bf16. A q5 weight reads 1.13 bytes and a q8 weight 1.25, against
0.66 and 1.06 stored (q4: 0.56 and 0.53). Activations go in as bf16 and the kernel
accumulates in float32: the production precision of the GPU path whose host share this is
(float32 activations take the kernel's slow path). The kernel needs rows in multiples of 16
and whole groups; a weight it cannot read stays with the reference (``pack`` answers None).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .host_codes import FORMATS, codes_of

__all__ = ["FORMATS", "Int4Weight", "TorchInt4", "accepts", "host_products"]

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


def _planes(
    bits: int, codes: np.ndarray, scales: np.ndarray, offsets: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's codes ``[N, planes · K]`` (int32, 0..15) and scale and zero
    ``[planes · groups, N, 2]`` (float32) of stored ``codes`` [N, K], scales and offsets
    [N, groups] (``host_codes``: ``w = s · q + o``); an offset joins the first plane's zero."""
    s = scales.T  # [groups, N]
    o = np.zeros_like(s) if offsets is None else offsets.T
    # the planes are made in bytes (a quarter of int32's passes) and widened once at the end
    if bits == 4:
        return (codes + np.int8(OFFSET)).astype(np.int32), np.stack([s, o], axis=-1)
    # q + 2^(b-1) in 0 .. 2^b - 1: the int8 codes' bytes plus 2^(b-1), modulo 256
    unsigned = codes.view(np.uint8) + np.uint8(1 << (bits - 1))
    high = unsigned >> 4
    if bits < 8:
        high += np.uint8(OFFSET)
    low_pairs = np.stack([s, 8 * s + o], axis=-1)
    high_zero = np.zeros_like(s) if bits == 8 else -float(1 << (bits - 1)) * s
    high_pairs = np.stack([16 * s, high_zero], axis=-1)
    return (
        np.concatenate([unsigned & np.uint8(15), high], axis=1).astype(np.int32),
        np.concatenate([low_pairs, high_pairs], axis=0),
    )


class TorchInt4:
    """What a host expert's math calls as its backend (``linear``), and how its weights are
    made ready for it (``pack``)."""

    name = "torch_int4"

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
        parts = [codes_of(p) for p in pieces]
        offsets = [o for _, _, o in parts]
        codes, pairs = _planes(
            bits,
            np.concatenate([c for c, _, _ in parts]),
            np.concatenate([s for _, s, _ in parts]),
            None if offsets[0] is None else np.concatenate(offsets),
        )
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(codes), 1)
        zeros = torch.from_numpy(np.ascontiguousarray(pairs)).to(torch.bfloat16)
        return Int4Weight(packed, zeros, (rows, width), group, codes.shape[1] // width)

    @staticmethod
    def linear(x: np.ndarray, w: Int4Weight) -> np.ndarray:
        """``x @ w.T`` for rows x [n, columns], float32 in and out (bf16 into the kernel;
        the rows given once a plane, side by side before the conversion: numpy joins a
        decode step's row in a fraction of what torch's ``repeat`` takes)."""
        x = np.asarray(x, dtype=np.float32)
        if w.planes > 1:
            x = np.concatenate([x] * w.planes, axis=1)
        rows = torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, w.packed, w.group, w.scales)
        return out.float().numpy()

    def use_threads(self, threads: int) -> None:
        """The cores the calling thread's products may take. torch keeps a count per thread,
        but a thread's first use of its parallel loops takes the count the process set last,
        whatever the thread set before: so the count is asked of torch at every call, never
        remembered (experts computed side by side share the cores out)."""
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


_KERNEL = TorchInt4()


def host_products() -> TorchInt4:
    return _KERNEL


def accepts(**_: object) -> bool:
    """Beside any engine device (the policy keeps it off the CPU backend's, whose host share
    is the float32 oracle's)."""
    return True
