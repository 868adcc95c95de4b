"""The linear family's oracle: ``product`` as numpy, the object's bytes decoded by its format's
codec (``ninfer_format.codecs``, the numpy decoders every kernel is checked against) and
multiplied in float32. Host arrays only; tile-packed objects (their bytes rearranged at upload,
``backends/cuda/tiles.py``) are declined: the oracle of a tiled product is this product on the
object as stored."""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_format.codecs import codec_for

from ...arrays import array_module
from ...backends.cuda import formats as F

__all__ = ["TOLERANCE", "accepts", "decoded", "matmul", "product"]

#: format code -> (format, layout) of every layout the kernels read in place
_STORED = {code: stored for stored, code in F.PACKED.items()}

#: provider -> bound on |y - x·Wᵀ| as a fraction of Σ_k |x_k| |W_rk| (each output's
#: magnitudes), against the product in float64 of the same decoded weights: float32
#: accumulation, and x carried as two bf16 halves (~16 bits) on the tensor cores (the bounds
#: tests/gpu/test_kernels.py, test_small_gemm.py and test_tiles.py hold the kernels to)
TOLERANCE: dict[str, float] = {
    "reference": 2e-6,
    "gemv": 2e-6,
    "tensor_cores": 1e-5,
    "tiles": 1e-5,
    # ``matmul``'s: float32 products summed in float32 (fused multiply-adds in ours)
    "nvrtc": 2e-6,
}


def accepts(*, tiled: bool, **_: object) -> bool:
    return not tiled


def decoded(data: Any, p: F.Planes) -> np.ndarray:
    """The whole object ``[p.rows, p.columns]`` as float32, decoded from its bytes."""
    if p.tiled:
        raise ValueError("linear.reference: a tile-packed object (decode it as stored)")
    fmt, layout = _STORED[p.code]
    divisors = p.rows // p.rows_per_divisor if p.code == F.NVFP4 else 1
    raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    return codec_for(fmt, layout).decode(raw, (p.rows, p.columns), divisors)


def product(data: Any, p: F.Planes, row0: int, rows: int, x: Any, y: Any, ldy: int) -> None:
    """``y[m, r] = Σ_k x[m, k] W[row0 + r, k]``: x float32 [M, >= p.columns] (columns past
    ``p.columns`` are the kernels' zero padding, not read), y a float32 view [M, >= rows]
    whose rows are ``ldy`` values apart."""
    if y.shape[0] > 1 and y.strides[0] != ldy * y.itemsize:
        raise ValueError(f"linear.reference: y's rows are {y.strides[0]} bytes apart, not ldy")
    w = decoded(data, p)[row0 : row0 + rows]
    y[:, :rows] = np.asarray(x, dtype=np.float32)[:, : p.columns] @ w.T


def matmul(a: Any, b: Any) -> Any:
    """``a @ b`` of two arrays as their own module computes it (numpy; CuPy: cuBLAS)."""
    return array_module(a).matmul(a, b)
