"""The sampling family's oracle: log-probabilities as array math, numpy or CuPy alike.

``log_softmax`` is the one normalisation the engine and ``ninfer-perplexity`` share: each row
less its maximum, less the log of the sum of its exponentials, in the rows' own float32.
``score`` applies the same arithmetic only where it is needed: per row the normaliser, the
chosen token's value and the ``k`` best values, computed where the logits live; the k best by
k rounds of argmax, each masking the one it found (CuPy's argpartition sorts the whole row),
ties lowest id first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...arrays import array_module
from ...backends.base import to_numpy

__all__ = ["TOLERANCE", "accepts", "log_softmax", "score"]

Array = Any

#: provider -> (rtol, atol) of a log-probability against this oracle on the same float32 rows
#: (the kernel sums the exponentials in float64, in another order)
TOLERANCE: dict[str, tuple[float, float]] = {"reference": (0.0, 1e-6), "nvrtc": (0.0, 1e-5)}


def accepts(**_: object) -> bool:
    return True


def _normaliser(rows: Array) -> tuple[Array, Array]:
    """Per row (keeping the axis): its maximum, and the log of the sum of exp(row - max)."""
    xp = array_module(rows)
    shift = rows.max(axis=-1, keepdims=True)
    return shift, xp.log(xp.exp(rows - shift).sum(axis=-1, keepdims=True))


def log_softmax(rows: Array) -> Array:
    """``rows`` [N, V] -> log-probabilities [N, V] (same array module and dtype)."""
    shift, log_total = _normaliser(rows)
    return (rows - shift) - log_total


def score(rows: Array, chosen: Sequence[int] | Array, k: int) -> np.ndarray:
    """float64 [N, 1 + 2k] on the host: chosen values, then the k top values, then their ids.
    ``chosen``: host ids, or an integer array where the rows are."""
    xp = array_module(rows)
    n = rows.shape[0]
    shift, log_total = _normaliser(rows)
    lanes = xp.arange(n)
    picked = rows[lanes, xp.asarray(chosen).astype(xp.int64, copy=False)][:, None]
    columns = [(picked - shift) - log_total]
    if k:
        ids = _top_ids(rows, k, lanes)
        values = xp.take_along_axis(rows, ids, axis=-1)
        columns += [(values - shift) - log_total, ids.astype(xp.float64)]
    return to_numpy(xp.concatenate([c.astype(xp.float64) for c in columns], axis=1))


def _top_ids(rows: Array, k: int, lanes: Array) -> Array:
    """int64 [N, k]: each row's k largest entries' ids, largest first, ties lowest id first."""
    xp = array_module(rows)
    left = rows.copy()
    ids = xp.empty((rows.shape[0], k), dtype=xp.int64)
    for j in range(k):
        best = xp.argmax(left, axis=-1)
        ids[:, j] = best
        left[lanes, best] = -xp.inf
    return ids
