"""Our norm kernels (``backends/cuda/kernels/glue.cu``, launched by ``backends/cuda/glue.py``):
one pass a row (a warp a row up to ``glue.SHORT_ROW`` values), float32, capturable."""

from __future__ import annotations

from typing import Any

from ...backends.cuda import glue
from ...backends.cuda.glue import add_rms_norm, gated_rms_norm, rms_norm

__all__ = ["accepts", "add_rms_norm", "gated_rms_norm", "rms_norm", "sinkhorn"]


def accepts(*, device: str, **_: object) -> bool:
    return device == "cuda"


def sinkhorn(logits: Any, *, iterations: int, eps: float) -> Any:
    """The reference's ``sinkhorn`` in one launch, a thread a matrix."""
    return glue.sinkhorn(logits, iterations, eps)
