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

register_family("matmul", ["matmul_f32<1>", "matmul_f32<4>"])


def matmul(a: Any, b: Any) -> Any:
    """``a @ b`` as numpy's ``matmul`` for a [M, K] or [B, M, K] and b [K, N] or [B, K, N]
    (a batch of 1 broadcasts), any strides, read as float32 -> float32, contiguous."""
    import cupy as cp

    if a.ndim not in (2, 3) or b.ndim not in (2, 3) or a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"matmul: a {a.shape} and b {b.shape}: expected [(B,) M, K] and [(B,) K, N]"
        )
    a, b = a.astype(cp.float32, copy=False), b.astype(cp.float32, copy=False)
    batch_a, batch_b = (x.shape[0] if x.ndim == 3 else 1 for x in (a, b))
    if 1 not in (batch_a, batch_b) and batch_a != batch_b:
        raise ValueError(f"matmul: batches of {batch_a} and {batch_b} do not broadcast")
    batch, (m, k), n = max(batch_a, batch_b), a.shape[-2:], b.shape[-1]
    out = cp.empty((batch, m, n), cp.float32)
    if out.size and not k:
        out.fill(0)
    elif out.size:
        _launch(a, b, out, batch_a > 1, batch_b > 1)
    return out if a.ndim == 3 or b.ndim == 3 else out[0]


def _launch(a: Any, b: Any, out: Any, batched_a: bool, batched_b: bool) -> None:
    batch, m, n = out.shape
    k = a.shape[-1]
    tm = 1 if m <= FEW_ROWS else 4
    block_rows = 16 * tm
    if -(-m // block_rows) > 65535:
        raise ValueError(f"matmul: {m} rows exceed one launch's grid")
    sa = _strides(a, batched_a)
    sb = _strides(b, batched_b)
    kernel = function("matmul", f"matmul_f32<{tm}>")
    for z0 in range(0, batch, GRID_Z):
        grid = (-(-n // COLUMNS), -(-m // block_rows), min(GRID_Z, batch - z0))
        dims = (np.int32(m), np.int32(n), np.int32(k))
        kernel(grid, (THREADS,), (a, b, out, *dims, *sa, *sb, np.int32(z0)))


def _strides(x: Any, batched: bool) -> tuple[np.int64, np.int64, np.int64]:
    """x's (batch, row, column) strides in elements; a batch of one is read again by every
    block (stride 0)."""
    row, column = (np.int64(s // x.itemsize) for s in x.strides[-2:])
    batch = np.int64(x.strides[0] // x.itemsize) if batched else np.int64(0)
    return batch, row, column
