"""Prefill attention on torch's fused scaled-dot-product attention (FlashAttention-class
kernels: flash, or memory-efficient where flash declines) as an attention provider.

One lane's chunk of T queries at positions ``start .. start + T - 1`` attends causally over its
first ``start + T`` keys: the lane's pages are gathered into contiguous bf16 K/V (bf16 words
are viewed as bf16, float32 and E4M3 values converted), the queries rounded to bf16, and
``scaled_dot_product_attention`` runs with the causal mask aligned to the last query
(``causal_lower_right``) and grouped query heads (``enable_gqa``), on CuPy's current stream
through DLPack views. Products in bf16 with float32 accumulation: the production precision
(``prefill_precision = "bf16"``), so this provider declines the split-precision modes."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..torch_interop import on_cupy_stream, view

__all__ = ["accepts", "as_bf16", "prefill"]

Array = Any

#: pool storage dtype -> how its words become torch bf16
_STORAGE = {
    np.dtype(np.float32): "float32",
    np.dtype(np.uint16): "bf16",
    np.dtype(np.uint8): "e4m3",
}


def accepts(*, device: str, precision: str, head_dim: int, storage: str, **_: object) -> bool:
    return (
        device == "cuda"
        and precision == "bf16"
        and head_dim <= 256
        and storage in ("float32", "bf16", "e4m3")
    )


def as_bf16(rows: Array, dtype: Any) -> Any:
    """Stored K/V ``rows`` (CuPy, of the pool's ``dtype``) as a torch bf16 tensor: bf16 words
    viewed, float32 and E4M3 values converted."""
    import torch

    x = view(rows)
    kind = _STORAGE[np.dtype(dtype)]
    if kind == "bf16":
        x = x.view(torch.bfloat16)
    elif kind == "e4m3":
        x = x.view(torch.float8_e4m3fn)
    return x.to(torch.bfloat16)


def prefill(
    q: Array, k_pages: Array, v_pages: Array, pages: Array, *, start: int, scale: float, **_: Any
) -> Array:
    """q [T, Nq, D] float32 -> [T, Nq, D] float32 (as ``reference.prefill``)."""
    import cupy as cp
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    t = q.shape[0]
    length = start + t
    page_tokens = k_pages.shape[1]
    used = cp.asarray(pages)[: -(-length // page_tokens)]

    def keys(pool: Array) -> Any:
        rows = pool[used].reshape(-1, *pool.shape[2:])[:length]  # [S, Nkv, D], one gather
        return as_bf16(rows, pool.dtype).transpose(0, 1)[None]  # [1, Nkv, S, D]

    with on_cupy_stream():
        query = view(q).to(torch.bfloat16).transpose(0, 1)[None]
        out = F.scaled_dot_product_attention(
            query,
            keys(k_pages),
            keys(v_pages),
            attn_mask=causal_lower_right(t, length),
            scale=scale,
            enable_gqa=True,
        )
        result = out[0].transpose(0, 1).to(torch.float32).contiguous()  # [T, Nq, D]
    return cp.from_dlpack(result)
