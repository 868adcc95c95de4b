"""Our prefill attention kernel (``backends/cuda/kernels/prefill_attention.cu``): a lane's K/V
tiles read through its page ids straight from the pool, in every prefill precision."""

from __future__ import annotations

from typing import Any

import cupy as cp

from ...backends.cuda import prefill_attention as pfa

__all__ = ["accepts", "prefill"]

#: the backend's prefill precision -> the kernel's (the scores split into two halves always:
#: their error grows with their size)
_PRECISION = {"bf16": "bf16", "tf32": "split_qk", "float32": "split"}


def accepts(*, device: str, head_dim: int, storage: str, **_: object) -> bool:
    return device == "cuda" and head_dim in pfa.HEAD_DIMS and storage in ("float32", "bf16", "e4m3")


def prefill(
    q: Any, k_pages: Any, v_pages: Any, pages: Any, *, start: int, scale: float, precision: str
) -> Any:
    return pfa.prefill_attention(
        pfa.kernel_input(q),
        k_pages,
        v_pages,
        cp.ascontiguousarray(pages, dtype=cp.int32),
        start=start,
        scale=scale,
        precision=_PRECISION[precision],
    )
