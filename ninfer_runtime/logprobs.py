"""Log-probabilities of tokens under rows of logits, for numpy and CuPy arrays alike.

``log_softmax`` is the one normalisation the engine and ``ninfer-perplexity`` share: each row
less its maximum, less the log of the sum of its exponentials, in the rows' own float32. The
engine's ``token_logprobs`` applies the same arithmetic only where it is needed: per row the
normaliser, the chosen token's value and the ``k`` best values are computed where the logits
live (on the GPU, no vocabulary-wide row is copied), and one small array of those numbers
crosses to the host.

On CuPy float32 rows with k <= 20 (what the OpenAI surface asks for) one CUDA kernel does it
all (``backends.cuda.sampling.score``: two passes over each row, a fraction of a decode step).
Elsewhere the k best are found by k rounds of argmax, each masking the one it found (CuPy's
argpartition sorts the whole row); ties come out lowest id first on every path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arrays import array_module
from .backends.base import to_numpy

Array = Any
#: (token id, log-probability) pairs, most likely first
TopLogprobs = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class TokenLogprobs:
    """One scored token: its log-probability and the ``k`` most likely tokens of its row."""

    logprob: float
    top: TopLogprobs


def _normaliser(rows: Array) -> tuple[Array, Array]:
    """Per row (keeping the axis): its maximum, and the log of the sum of exp(row - max)."""
    xp = array_module(rows)
    shift = rows.max(axis=-1, keepdims=True)
    return shift, xp.log(xp.exp(rows - shift).sum(axis=-1, keepdims=True))


def log_softmax(rows: Array) -> Array:
    """``rows`` [N, V] -> log-probabilities [N, V] (same array module and dtype)."""
    shift, log_total = _normaliser(rows)
    return (rows - shift) - log_total


def token_logprobs(rows: Array, chosen: Sequence[int], tops: Sequence[int]) -> list[TokenLogprobs]:
    """Row i of ``rows`` (float32 logits [N, V], numpy or CuPy) scores token ``chosen[i]``,
    with its ``tops[i]`` most likely tokens (at most V; ties: lowest id first). Values equal
    ``log_softmax(rows)`` at those entries."""
    n, vocab = rows.shape
    if len(chosen) != n or len(tops) != n:
        raise ValueError(f"token_logprobs: {n} rows, {len(chosen)} tokens, {len(tops)} tops")
    xp = array_module(rows)
    k = min(max(tops, default=0), vocab)
    if xp is not np and rows.dtype == np.float32 and rows.strides[1] == 4:
        from .backends.cuda.sampling import MAX_SCORED_TOP, score

        if k <= MAX_SCORED_TOP:
            return _unpacked(score(rows, chosen, k), tops, k, vocab)
    shift, log_total = _normaliser(rows)
    lanes = xp.arange(n)
    picked = rows[lanes, xp.asarray(np.asarray(chosen, dtype=np.int64))][:, None]
    columns = [(picked - shift) - log_total]
    if k:
        ids = _top_ids(rows, k, lanes)
        values = xp.take_along_axis(rows, ids, axis=-1)
        columns += [(values - shift) - log_total, ids.astype(xp.float64)]
    # one copy to the host: chosen values, then the top values, then their ids (exact in
    # float64 for any vocabulary)
    packed = to_numpy(xp.concatenate([c.astype(xp.float64) for c in columns], axis=1))
    return _unpacked(packed, tops, k, vocab)


def _unpacked(packed: np.ndarray, tops: Sequence[int], k: int, vocab: int) -> list[TokenLogprobs]:
    """Rows of [chosen value, k top values, k top ids] as ``TokenLogprobs``, row i keeping
    its own ``tops[i]`` best."""
    out = []
    for i in range(len(tops)):
        width = min(tops[i], vocab)
        values, ids = packed[i, 1 : 1 + width], packed[i, 1 + k : 1 + k + width]
        pairs = tuple((int(t), float(v)) for t, v in zip(ids, values, strict=True))
        out.append(TokenLogprobs(float(packed[i, 0]), pairs))
    return out


def score_rows(
    rows: Array, chosen: Sequence[int], tops: Sequence[int | None]
) -> list[TokenLogprobs | None]:
    """``token_logprobs`` of the rows whose ``tops[i]`` is not None (None for the others,
    which ask for no scores): only those rows are scored and only their numbers cross to
    the host."""
    asking = [i for i, k in enumerate(tops) if k is not None]
    scores: list[TokenLogprobs | None] = [None] * len(tops)
    if asking:
        if len(asking) < len(tops):
            rows = rows[array_module(rows).asarray(asking)]
        found = token_logprobs(rows, [chosen[i] for i in asking], [tops[i] or 0 for i in asking])
        for i, score in zip(asking, found, strict=True):
            scores[i] = score
    return scores


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
