"""Segment attention (``segment``) on torch's fused scaled-dot-product attention, for a vision
tower on the CUDA backend.

q, k and v [P, heads, D] float32 are viewed as torch tensors through DLPack (no copy), rounded
to bf16 once, and each segment ``bounds[i] .. bounds[i+1]`` runs as one
``scaled_dot_product_attention`` call without a mask (flash or memory-efficient kernels: the
segment's score matrix is never stored), on CuPy's current stream. Products in bf16 with
float32 accumulation, as the paged prefill's ``sdpa`` provider: the production precision
(``prefill_precision = "bf16"``), so this provider declines the split-precision modes and the
reference serves them."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from ..torch_interop import on_cupy_stream, view

__all__ = ["accepts", "attend_segments", "segment"]

Array = Any


def accepts(*, device: str, precision: str, head_dim: int, **_: object) -> bool:
    return device == "cuda" and precision == "bf16" and head_dim <= 256


def attend_segments(query: Any, key: Any, value: Any, bounds: Sequence[int], scale: float) -> Any:
    """torch tensors q, k, v [P, heads, D] (any one dtype) -> [P, heads, D] float32: each
    segment attended on its own (the torch half of ``segment``; it runs on any torch device)."""
    import torch
    import torch.nn.functional as F

    out = torch.empty(query.shape, dtype=torch.float32, device=query.device)
    for start, stop in itertools.pairwise(bounds):

        def heads_first(x: Any, start: int = start, stop: int = stop) -> Any:
            return x[start:stop].transpose(0, 1)[None]  # [1, heads, S, D]

        attended = F.scaled_dot_product_attention(
            heads_first(query), heads_first(key), heads_first(value), scale=scale
        )
        out[start:stop] = attended[0].transpose(0, 1)
    return out


def segment(q: Array, k: Array, v: Array, bounds: Sequence[int], scale: float) -> Array:
    """q, k, v [P, heads, D] float32 CuPy arrays -> [P, heads, D] float32 (as
    ``segment_reference.segment``)."""
    import cupy as cp
    import torch

    with on_cupy_stream():
        query, key, value = (view(x).to(torch.bfloat16) for x in (q, k, v))
        result = attend_segments(query, key, value, bounds, scale)
    return cp.from_dlpack(result)
