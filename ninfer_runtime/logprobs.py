"""Log-probabilities of tokens under rows of logits, for numpy and CuPy arrays alike, as the
engine reports them (``TokenLogprobs``).

``log_softmax`` is the one normalisation the engine and ``ninfer-perplexity`` share (the
sampling family's reference, ``ops/sampling/reference.py``). ``token_logprobs`` computes only
what is asked, where the logits live: the sampling family's ``score`` op (on CUDA one kernel
for up to 20 tops, else array math) gives per row the chosen token's value and the ``k`` best,
and one small array of those numbers crosses to the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arrays import array_module
from .ops.registry import resolve
from .ops.sampling.reference import log_softmax

__all__ = ["TokenLogprobs", "TopLogprobs", "log_softmax", "score_rows", "token_logprobs"]

Array = Any
#: (token id, log-probability) pairs, most likely first
TopLogprobs = tuple[tuple[int, float], ...]

#: a prompt scored token by token (``prompt_logprobs``) is read alone, in chunks of at most
#: this many tokens: each chunk's logits over the whole vocabulary are computed at once (the
#: most logit rows any prefill call computes)
PROMPT_LOGPROB_CHUNK = 256


@dataclass(frozen=True)
class TokenLogprobs:
    """One scored token: its log-probability and the ``k`` most likely tokens of its row."""

    logprob: float
    top: TopLogprobs


def token_logprobs(
    rows: Array, chosen: Sequence[int] | Array, tops: Sequence[int]
) -> list[TokenLogprobs]:
    """Row i of ``rows`` (float32 logits [N, V], numpy or CuPy) scores token ``chosen[i]``
    (host ids, or an integer array where the rows are: the device sampler's, unread), with
    its ``tops[i]`` most likely tokens (at most V; ties: lowest id first). Values equal
    ``log_softmax(rows)`` at those entries."""
    n, vocab = rows.shape
    if len(chosen) != n or len(tops) != n:
        raise ValueError(f"token_logprobs: {n} rows, {len(chosen)} tokens, {len(tops)} tops")
    xp = array_module(rows)
    k = min(max(tops, default=0), vocab)
    score = resolve(
        "sampling",
        "score",
        device="cpu" if xp is np else "cuda",
        top=k,
        float32_rows=bool(rows.dtype == np.float32 and rows.strides[1] == 4),
    )
    return _unpacked(score(rows, chosen, k), tops, k, vocab)


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
    rows: Array, chosen: Sequence[int] | Array, tops: Sequence[int | None]
) -> list[TokenLogprobs | None]:
    """``token_logprobs`` of the rows whose ``tops[i]`` is not None (None for the others,
    which ask for no scores): only those rows are scored and only their numbers cross to
    the host."""
    asking = [i for i, k in enumerate(tops) if k is not None]
    scores: list[TokenLogprobs | None] = [None] * len(tops)
    if asking:
        if len(asking) < len(tops):
            xp = array_module(rows)
            index = xp.asarray(asking)
            rows = rows[index]
            chosen = xp.asarray(chosen)[index]
        found = token_logprobs(rows, chosen, [tops[i] or 0 for i in asking])
        for i, score in zip(asking, found, strict=True):
            scores[i] = score
    return scores
