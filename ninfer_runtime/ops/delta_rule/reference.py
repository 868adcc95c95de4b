"""The delta rule's oracle: the chunked form as array math (numpy or CuPy, float32 or
float64), ``array_ops.gdn_chunk``; the recurrent form ``gdn_step`` checks it."""

from __future__ import annotations

from ...backends.array_ops import gdn_chunk as chunk

__all__ = ["TOLERANCE", "accepts", "chunk"]


def accepts(**_: object) -> bool:
    return True


#: provider -> (rtol, atol as a fraction of the largest reference value): how close each
#: provider's out and state come to this oracle computed in float64 on the same float32
#: inputs (fla's Triton products round their inputs to tf32)
TOLERANCE: dict[str, tuple[float, float]] = {
    "reference": (1e-5, 1e-6),
    "nvrtc": (1e-4, 2e-5),
    "fla": (5e-3, 2e-3),
}
