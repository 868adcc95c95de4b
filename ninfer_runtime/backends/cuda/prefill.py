"""Prefill products (more rows than the small-M kernels take) in bfloat16 on tensor cores.

``CudaBackend.linear`` hands each weight segment that no small-M kernel serves to
``CudaBackend._dequant_matmul``. With ``prefill_precision="bf16"`` (the default) that

1. rounds the activations x [M, K] (float32) to bfloat16 words once (``to_bf16``);
2. dequantizes a slab of weight rows straight to bfloat16 words (``kernels.dequant_rows``; bf16
   weights need no copy: their stored rows are the operand, ``bf16_rows``);
3. multiplies with ``gemm_bf16``: one ``cublasGemmEx`` (A/B ``CUDA_R_16BF``, C ``CUDA_R_32F``,
   ``CUBLAS_COMPUTE_32F``, default algorithm) writing float32 into the output's column slice.

Precision: the products see bf16-rounded x and bf16-rounded weights (exact for bf16 weights;
``code x scale`` rounded to 8 mantissa bits otherwise) and accumulate in float32.
``"tf32"`` and ``"float32"`` keep the float32 scratch + ``cp.matmul`` path (TF32 tensor-op
math, or full float32). The environment's ``NINFER_CUDA_PREFILL`` picks the mode for
``create_backend``.

Like every launcher module this one imports without CuPy, so ``scripts/check_kernels.py``
sees the kernels it registers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import formats as F
from .compile import function, register_family
from .env import env_choice

#: prefill product precisions, most accurate last
PRECISIONS = ("bf16", "tf32", "float32")
DEFAULT_PRECISION = "bf16"
#: environment variable ``create_backend`` reads the precision from
ENV = "NINFER_CUDA_PREFILL"

#: cudaDataType_t (library_types.h)
CUDA_R_32F = 0
CUDA_R_16BF = 14
#: cublasComputeType_t (cublas_api.h): float32 accumulation, inputs as given or (FAST_TF32)
#: float32 inputs rounded to TF32 on the tensor cores
CUBLAS_COMPUTE_32F = 68
CUBLAS_COMPUTE_32F_FAST_TF32 = 77
#: cublasGemmAlgo_t: cuBLAS's heuristic choice (tensor cores for bf16 inputs)
CUBLAS_GEMM_DEFAULT = -1
#: cublasOperation_t
CUBLAS_OP_N = 0
CUBLAS_OP_T = 1

THREADS = 256
#: grid cap of the grid-stride element loops
MAX_BLOCKS = 65535 * 8

register_family("dequant", ["f32_to_bf16", "f32_to_bf16x4", "f32_split_tf32"])

# alpha = 1, beta = 0 as host scalars (CUBLAS_POINTER_MODE_HOST reads them during the call)
_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)


#: slabs start on multiples of this many rows, so the output column slice each product
#: writes starts 16-byte aligned (the 27B's gate|up, 34,816 rows, in slabs of 26,214 and
#: 8,602 rows took 3.3 ms on the H200 against 1.3 ms for its dequantization and product
#: timed whole)
SLAB_ALIGN = 128


def slab_rows(rows: int, most: int) -> int:
    """Rows per slab of a ``rows``-row weight when the scratch holds ``most`` rows: as few
    slabs as fit, of equal size rounded up to SLAB_ALIGN (the last one takes the rest)."""
    if rows <= most:
        return rows
    most = max(SLAB_ALIGN, most // SLAB_ALIGN * SLAB_ALIGN)
    slabs = -(-rows // most)
    even = -(-rows // slabs)
    return min(most, -(-even // SLAB_ALIGN) * SLAB_ALIGN)


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"prefill precision {precision!r}: expected one of {PRECISIONS}")
    return precision


def precision_from_env(environ: Any = None) -> str:
    """``NINFER_CUDA_PREFILL`` (bf16 | tf32 | float32), default bf16."""
    return env_choice(ENV, PRECISIONS, DEFAULT_PRECISION, environ)


def _grid(total: int) -> int:
    return max(1, min((total + THREADS - 1) // THREADS, MAX_BLOCKS))


def to_bf16(x: Any, out: Any = None) -> Any:
    """float32 device array -> uint16 bfloat16 words of the same shape, round to nearest even
    (as ``ninfer_format.numeric.f32_to_bf16``). ``out``: an optional C-contiguous uint16
    array of x's shape to write."""
    import cupy as cp

    if x.dtype != np.float32:
        raise ValueError(f"x: dtype {x.dtype}, expected float32")
    x = cp.ascontiguousarray(x)
    if out is None:
        out = cp.empty(x.shape, dtype=cp.uint16)
    elif out.dtype != np.uint16 or out.shape != x.shape or not out.flags.c_contiguous:
        raise ValueError(f"out: {out.dtype} {out.shape}, expected C-contiguous uint16 {x.shape}")
    if x.size % 4 == 0 and x.data.ptr % 16 == 0 and out.data.ptr % 8 == 0:
        n4 = x.size // 4
        if n4:
            function("dequant", "f32_to_bf16x4")((_grid(n4),), (THREADS,), (x, np.int64(n4), out))
    elif x.size:
        function("dequant", "f32_to_bf16")((_grid(x.size),), (THREADS,), (x, np.int64(x.size), out))
    return out


def is_bf16(p: F.Planes) -> bool:
    """Whether the object is stored as bf16 rows (``bf16_rows`` serves them in place)."""
    return p.code == F.BF16


def bf16_rows(data: Any, p: F.Planes, row0: int, rows: int) -> Any:
    """Rows ``row0 .. row0 + rows - 1`` of a stored bf16 (``contiguous_le_v1``) object as a
    uint16 ``[rows, K]`` view of its bytes: already the GEMM's operand, nothing to decode."""
    if p.code != F.BF16:
        raise ValueError(f"format code {p.code} is not bf16")
    k = p.columns
    start = row0 * k * 2
    return data[start : start + rows * k * 2].view(np.uint16).reshape(rows, k)


def gemm_operands(
    n: int, k: int, m: int, y_strides: tuple[int, int]
) -> tuple[int, int, int, int, int, int, int, int]:
    """``(transa, transb, m', n', k', lda, ldb, ldc)`` of the column-major GEMM that computes
    ``y[M, N] = x[M, K] · w[N, K]ᵀ`` with w and x C-contiguous and y float32 rows
    ``y_strides[0]`` bytes apart (pure arithmetic: ``tests/gpu/test_prefill_gemm.py`` checks it
    against a column-major emulation on any machine).

    cuBLAS is column-major: the row-major y with row stride ``ldy`` is, read column-major, the
    ``N x M`` matrix yᵀ with leading dimension ``ldy``; row-major w [N, K] is the ``K x N``
    matrix wᵀ (ld K) and row-major x [M, K] the ``K x M`` matrix xᵀ (ld K). So yᵀ = w · xᵀ is
    ``op(A) = Aᵀ`` on w (transa = T, lda = K), ``op(B) = B`` on x (transb = N, ldb = K),
    m' = N, n' = M, k' = K and ldc = ldy: the "TN" GEMM, tensor cores' natural layout.
    """
    row_bytes, col_bytes = y_strides
    if (col_bytes != 4 and n > 1) or row_bytes % 4 or (m > 1 and row_bytes < 4 * n):
        raise ValueError(f"y strides {y_strides}: not a row-major float32 column slice")
    ldy = max(row_bytes // 4, n, 1)  # any value >= N serves when M == 1
    return CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, max(k, 1), max(k, 1), ldy


def gemm_bf16(w: Any, x: Any, y: Any) -> None:
    """``y[m, r] = Σ_k x[m, k] w[r, k]`` in float32 from bfloat16 operands, on tensor cores.

    ``w``: uint16 bf16 words ``[N, K]``, ``x``: uint16 bf16 words ``[M, K]`` (both
    C-contiguous); ``y``: float32 ``[M, N]`` whose rows may be further apart than N (a column
    slice of a wider row-major output; written, not accumulated). Operands: ``gemm_operands``.
    """
    if w.dtype != np.uint16 or x.dtype != np.uint16 or y.dtype != np.float32:
        raise ValueError(f"gemm_bf16: w {w.dtype}, x {x.dtype}, y {y.dtype}")
    _gemm_ex(w, x, y, CUDA_R_16BF, CUBLAS_COMPUTE_32F, _ZERO, "gemm_bf16")


def matmul_3xtf32(x: Any, w_split: Any) -> Any:
    """``x @ wᵀ`` (float32 x [M, K], w [N, K] given as ``split_tf32(w, 0)``, a weight's split
    made once) to about float32 accuracy on tensor cores: ``split_tf32(x, 1)`` against it is one
    TF32 GEMM over 3K that sums ``lo·hi + hi·lo + hi·hi`` in float32; the dropped ``lo·lo`` is
    below float32 rounding. (One GEMM rather than three accumulating ones: at the router's
    short N cuBLAS splits each product over K, and three splits with their reductions took
    5.8 ms of a 35B-A3B prefill chunk.)"""
    import cupy as cp

    if x.dtype != np.float32 or w_split.dtype != np.float32 or 3 * x.shape[1] != w_split.shape[1]:
        raise ValueError(
            f"matmul_3xtf32: x {x.dtype} {x.shape}, w split {w_split.dtype} {w_split.shape}"
        )
    y = cp.empty((x.shape[0], w_split.shape[0]), dtype=cp.float32)
    xs = split_tf32(x, 1)
    _gemm_ex(w_split, xs, y, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, _ZERO, "matmul_3xtf32")
    return y


def split_tf32(x: Any, lo_slot: int) -> Any:
    """float32 x [M, K] -> [M, 3K]: x = hi + lo exactly, hi rounded to TF32 (10 mantissa bits,
    nearest, ties away); each row holds hi in its three K-wide slots but slot ``lo_slot``, which
    holds lo (a weight's split takes slot 0, an activation's slot 1: ``matmul_3xtf32``)."""
    import cupy as cp

    if lo_slot not in (0, 1, 2) or x.ndim != 2:
        raise ValueError(f"split_tf32: x {x.shape}, lo_slot {lo_slot}: expected [M, K] and 0..2")
    x = cp.ascontiguousarray(x, dtype=cp.float32)
    rows, k = x.shape
    out = cp.empty((rows, 3 * k), dtype=cp.float32)
    if x.size:
        function("dequant", "f32_split_tf32")(
            (_grid(x.size),), (THREADS,), (x, np.int64(rows), np.int32(k), np.int32(lo_slot), out)
        )
    return out


def _gemm_ex(w: Any, x: Any, y: Any, ab_type: int, compute: int, beta: Any, what: str) -> None:
    """One ``cublasGemmEx``: ``y = w·xᵀ`` as rows (``gemm_operands``), plus beta times y."""
    import cupy as cp
    from cupy_backends.cuda.libs import cublas

    n, k = w.shape
    m = x.shape[0]
    if x.shape != (m, k) or tuple(y.shape) != (m, n):
        raise ValueError(f"{what}: w {w.shape}, x {x.shape}, y {y.shape}")
    if not (w.flags.c_contiguous and x.flags.c_contiguous):
        raise ValueError(f"{what}: w and x must be C-contiguous")
    transa, transb, gm, gn, gk, lda, ldb, ldc = gemm_operands(n, k, m, y.strides)
    if m == 0 or n == 0:
        return
    if k == 0:
        if beta is _ZERO:
            y[...] = 0
        return
    handle = cp.cuda.device.get_cublas_handle()
    # CuPy shares this handle: set what the call relies on rather than assume it
    cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    cublas.gemmEx(
        handle,
        transa,
        transb,
        gm,
        gn,
        gk,
        _ONE.ctypes.data,
        w.data.ptr,
        ab_type,
        lda,
        x.data.ptr,
        ab_type,
        ldb,
        beta.ctypes.data,
        y.data.ptr,
        CUDA_R_32F,
        ldc,
        compute,
        CUBLAS_GEMM_DEFAULT,
    )


__all__ = [
    "DEFAULT_PRECISION",
    "ENV",
    "PRECISIONS",
    "bf16_rows",
    "check_precision",
    "gemm_bf16",
    "gemm_operands",
    "is_bf16",
    "matmul_3xtf32",
    "precision_from_env",
    "slab_rows",
    "split_tf32",
    "to_bf16",
]
