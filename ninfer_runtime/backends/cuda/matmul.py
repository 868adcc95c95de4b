"""Launcher of ``kernels/matmul.cu``: ``a @ b`` of two float32 device arrays, batched, in one
launch that a CUDA graph capture can record (the linear family's ``matmul``, ours)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .compile import function, register_family

#: rows of A and B's columns a block covers: 16 TM x MATMUL_BN (kernels/matmul.cu)
COLUMNS = 64
THREADS = 256
#: products of at most this many rows take the one-row-a-thread kernel (TM = 1)
FEW_ROWS = 16
#: the most blocks a launch's batch axis (grid z) takes; longer batches take several launches
GRID_Z = 65535

# eager products are cuBLAS's: only a captured step launches these
register_family("matmul", ["matmul_f32<1>", "matmul_f32<4>"], capture_only=True)


def matmul(a: Any, b: Any) -> Any:
    """``a @ b`` as numpy's ``matmul`` for a [..., M, K] and b [..., K, N] with up to two batch
    axes each (broadcast as numpy does), any strides, read as float32 -> float32, contiguous."""
    import cupy as cp

    if not (2 <= a.ndim <= 4 and 2 <= b.ndim <= 4) or a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"matmul: a {a.shape} and b {b.shape}: expected [..., M, K] and [..., K, N] "
            "with at most two batch axes"
        )
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(
            f"matmul: batches {a.shape[:-2]} and {b.shape[:-2]} do not broadcast"
        ) from None
    a, b = a.astype(cp.float32, copy=False), b.astype(cp.float32, copy=False)
    (m, k), n = a.shape[-2:], b.shape[-1]
    out = cp.empty((*batch, m, n), cp.float32)
    if out.size and not k:
        out.fill(0)
    elif out.size:
        _launch(a, b, out)
    return out


def _launch(a: Any, b: Any, out: Any) -> None:
    *batch, m, n = out.shape
    outer, inner = [1, 1, *batch][-2:]
    k = a.shape[-1]
    tm = 1 if m <= FEW_ROWS else 4
    block_rows = 16 * tm
    if -(-m // block_rows) > 65535:
        raise ValueError(f"matmul: {m} rows exceed one launch's grid")
    sa, sb = _strides(a), _strides(b)
    kernel = function("matmul", f"matmul_f32<{tm}>")
    dims = (np.int32(m), np.int32(n), np.int32(k))
    for z0 in range(0, outer * inner, GRID_Z):
        grid = (-(-n // COLUMNS), -(-m // block_rows), min(GRID_Z, outer * inner - z0))
        kernel(grid, (THREADS,), (a, b, out, *dims, *sa, *sb, np.int32(inner), np.int32(z0)))


def _strides(x: Any) -> tuple[np.int64, ...]:
    """x's (outer, inner, row, column) strides in elements, its batch axes aligned with the
    output's from the right (as numpy broadcasts); a batch axis it lacks or has once is read
    again by every block (stride 0)."""
    strides = [s // x.itemsize for s in x.strides]
    batch = [
        0 if size == 1 else stride for size, stride in zip(x.shape[:-2], strides[:-2], strict=True)
    ]
    batch = [0, 0, *batch][-2:]
    return tuple(np.int64(s) for s in (*batch, *strides[-2:]))
