"""Launchers for ``kernels/glue.cu``: RMSNorm and partial RoPE in one kernel each."""

from __future__ import annotations

from typing import Any

import numpy as np

from .compile import function, register_family

THREADS = 256  # GLUE_THREADS in kernels/glue.cu

register_family("glue", ["rms_norm_rows", "rope_rows"])


def rms_norm(x: Any, w: Any, eps: float, offset: float) -> Any:
    """``x / sqrt(mean(x²) + eps) * (w + offset)`` over the last axis (float32)."""
    import cupy as cp

    x = cp.ascontiguousarray(x, dtype=cp.float32)
    d = x.shape[-1]
    y = cp.empty_like(x)
    rows = x.size // d if d else 0
    if rows:
        function("glue", "rms_norm_rows")(
            (rows,),
            (THREADS,),
            (
                x,
                cp.ascontiguousarray(w, dtype=cp.float32),
                y,
                np.int32(d),
                np.float32(eps),
                np.float32(offset),
            ),
        )
    return y


def rope(x: Any, cos: Any, sin: Any) -> Any:
    """x [N, heads, D], cos/sin [N, rd] -> rotated copy (NeoX pairs i, i + rd/2)."""
    import cupy as cp

    x = cp.ascontiguousarray(x, dtype=cp.float32)
    heads, d = x.shape[1], x.shape[2]
    rd = cos.shape[-1]
    y = cp.empty_like(x)
    total = x.size
    if total:
        function("glue", "rope_rows")(
            ((total + THREADS - 1) // THREADS,),
            (THREADS,),
            (
                x,
                cp.ascontiguousarray(cos),
                cp.ascontiguousarray(sin),
                y,
                np.int32(heads),
                np.int32(d),
                np.int32(rd),
                np.int64(total),
            ),
        )
    return y
