"""Our kernels for the delta rule (``backends/cuda/kernels/gdn_prefill.cu``): float32 in and
out, compiled key head sizes, value head sizes a multiple of 4."""

from __future__ import annotations

from ...backends.cuda.gdn import KEY_DIMS
from ...backends.cuda.gdn_prefill import gdn_chunk as chunk

__all__ = ["accepts", "chunk"]


def accepts(*, device: str, key_dim: int, value_dim: int, **_: object) -> bool:
    return device == "cuda" and key_dim in KEY_DIMS and value_dim % 4 == 0
