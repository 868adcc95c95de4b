"""Launchers for ``kernels/glue.cu``: RMSNorm (alone or after a residual add) and partial
RoPE in one kernel each."""

from __future__ import annotations

from typing import Any

import numpy as np

from .compile import function, register_family

THREADS = 256  # GLUE_THREADS in kernels/glue.cu

register_family("glue", ["rms_norm_rows", "add_rms_norm_rows", "rope_rows"])


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


def add_rms_norm(h: Any, delta: Any, w: Any, eps: float, offset: float) -> tuple[Any, Any]:
    """``s = h + delta`` and ``rms_norm(s, w, eps, offset)`` in one pass (float32): the same
    values as the add followed by ``rms_norm``."""
    import cupy as cp

    h = cp.ascontiguousarray(h, dtype=cp.float32)
    delta = cp.ascontiguousarray(delta, dtype=cp.float32)
    if h.shape != delta.shape:
        raise ValueError(f"add_rms_norm: h {h.shape} and delta {delta.shape} differ")
    d = h.shape[-1]
    s, y = cp.empty_like(h), cp.empty_like(h)
    rows = h.size // d if d else 0
    if rows:
        function("glue", "add_rms_norm_rows")(
            (rows,),
            (THREADS,),
            (
                h,
                delta,
                cp.ascontiguousarray(w, dtype=cp.float32),
                s,
                y,
                np.int32(d),
                np.float32(eps),
                np.float32(offset),
            ),
        )
    return s, y


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
