"""The oracle of segment attention (``segment``), as array math (numpy or CuPy): a vision
tower's bidirectional attention, every row seeing every row of its own segment (one frame of
one image) and no other, with no causal mask and no K/V cache.

Queries are taken in blocks so that a large image (thousands of patches, every patch seeing
every other) never needs its whole score matrix at once."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from ...arrays import array_module
from ...backends.array_ops import softmax
from .reference import TOLERANCE as PREFILL_TOLERANCE

__all__ = ["SCORE_BLOCK_ELEMENTS", "TOLERANCE", "accepts", "segment"]

Array = Any

#: Elements of one block of attention scores [heads, rows, segment length].
SCORE_BLOCK_ELEMENTS = 1 << 24

#: provider -> (rtol, atol as a fraction of the largest reference value) of ``segment``
#: against this oracle computed in float64: the reference's float32 rounding, as the paged
#: prefill's; for ``sdpa`` q, k, v and the probabilities rounded to bf16 (unit roundoff 2^-9)
#: with float32 sums, over segments of hundreds of near-equal weights where the paged
#: prefill's causal rows mostly see few: 1e-2 (one H100 run measured 6.2e-3 at most)
TOLERANCE: dict[str, tuple[float, float]] = {
    "reference": PREFILL_TOLERANCE["reference"],
    "sdpa": (0.0, 1e-2),
}


def accepts(**_: object) -> bool:
    return True


def segment(q: Array, k: Array, v: Array, bounds: Sequence[int], scale: float) -> Array:
    """Bidirectional attention of q, k, v [P, heads, D] within each segment
    ``bounds[i] .. bounds[i+1]`` (one frame of one image): no row sees another segment."""
    xp = array_module(q)
    out = xp.empty_like(q)
    heads = q.shape[1]
    for start, stop in itertools.pairwise(bounds):
        keys = k[start:stop].transpose(1, 2, 0)  # [heads, D, S]
        values = v[start:stop].transpose(1, 0, 2)  # [heads, S, D]
        step = max(1, SCORE_BLOCK_ELEMENTS // (heads * (stop - start)))
        for first in range(start, stop, step):
            last = min(first + step, stop)
            queries = q[first:last].transpose(1, 0, 2)  # [heads, rows, D]
            probs = softmax((queries @ keys) * xp.float32(scale))
            out[first:last] = (probs @ values).transpose(1, 0, 2)
    return out
