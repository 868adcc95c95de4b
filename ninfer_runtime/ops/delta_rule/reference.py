"""The delta rule's oracle, as array math (numpy or CuPy, float32 or float64): the chunked form
``chunk`` (checked against the recurrent ``gdn_step``), a lane's prefill, a decode step, and a
speculative round's verification and commit."""

from __future__ import annotations

from ...backends.array_ops import gdn_chunk as chunk
from ...backends.array_ops import gdn_commit as commit
from ...backends.array_ops import gdn_decode as decode
from ...backends.array_ops import gdn_prefill as prefill
from ...backends.array_ops import gdn_verify as verify

__all__ = ["TOLERANCE", "accepts", "chunk", "commit", "decode", "prefill", "verify"]


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
