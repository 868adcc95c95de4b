"""The oracle of latent attention (``latent``), as array math (numpy or CuPy): queries already
absorbed into the latent space attend over the cached latents themselves, each query over the
tokens its own mask lets it see (a token indexer's choice, or everything causal).

With the key expansion K_h = latent · W_kᵀ_h folded into the query (q̃_h = W_k_h q_h), the
scores are q̃_h · latent_s and the output Σ_s p_s latent_s stays in the latent space; the
layer expands it with its value weights. This is the same attention as over expanded keys and
values, with only the latents read.
"""

from __future__ import annotations

from typing import Any

from ...backends.array_ops import softmax
from ...models.functional import _xp

__all__ = ["SCORE_BYTES", "accepts", "latent"]

Array = Any
#: the queries read at once keep their scores and probabilities [rows, Nq, S] float32 within
#: about this many bytes each: a prefill chunk's would otherwise take 4 GiB and more at a
#: long context (GLM5Next: 64 heads, 2,048 queries over 7,680 tokens), far past the
#: workspace a budget plans; each query's row is computed alike either way
SCORE_BYTES = 256 << 20


def accepts(**_: object) -> bool:
    return True


def latent(q: Array, latents: Array, visible: Array, *, scale: float) -> Array:
    """q [T, Nq, R] (absorbed queries) over latents [S, R], query t seeing the tokens where
    ``visible[t]`` [T, S] (bool) is set (at least one each) -> [T, Nq, R] float32; the
    queries a block at a time (``SCORE_BYTES``)."""
    xp = _xp(q)
    t, heads, _ = q.shape
    rows = max(1, SCORE_BYTES // (4 * heads * max(latents.shape[0], 1)))
    if t <= rows:
        return _rows(q, latents, visible, scale)
    out = xp.empty(q.shape, xp.float32)
    for at in range(0, t, rows):
        out[at : at + rows] = _rows(q[at : at + rows], latents, visible[at : at + rows], scale)
    return out


def _rows(q: Array, latents: Array, visible: Array, scale: float) -> Array:
    xp = _xp(q)
    scores = (q @ latents.T) * xp.float32(scale)  # [T, Nq, S]
    scores = xp.where(visible[:, None, :], scores, xp.float32(-xp.inf))
    return softmax(scores) @ latents
