"""Our token-scoring kernel (``score_tokens``, ``backends/cuda/kernels/sampling.cu``): one
block a row, two passes over it, up to ``MAX_SCORED_TOP`` tops."""

from __future__ import annotations

from ...backends.cuda.sampling import MAX_SCORED_TOP, score

__all__ = ["accepts", "score"]


def accepts(*, device: str, top: int, float32_rows: bool, **_: object) -> bool:
    return device == "cuda" and float32_rows and top <= MAX_SCORED_TOP
