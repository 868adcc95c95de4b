"""Our norm kernels (``backends/cuda/kernels/glue.cu``, launched by ``backends/cuda/glue.py``):
one pass a row (a warp a row up to ``glue.SHORT_ROW`` values), float32, capturable."""

from __future__ import annotations

from ...backends.cuda.glue import add_rms_norm, gated_rms_norm, rms_norm

__all__ = ["accepts", "add_rms_norm", "gated_rms_norm", "rms_norm"]


def accepts(*, device: str, **_: object) -> bool:
    return device == "cuda"
