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

from ...arrays import array_module
from ...backends.array_ops import softmax
from ...functional import by_query_blocks, query_block
from ..linear import matmul

__all__ = ["accepts", "latent"]

Array = Any


def accepts(**_: object) -> bool:
    return True


def latent(q: Array, latents: Array, visible: Array, *, scale: float) -> Array:
    """q [T, Nq, R] (absorbed queries) over latents [S, R], or [T, S, R]: each query's own
    sequence (a step's lanes), query t seeing the tokens where ``visible[t]`` [T, S] (bool)
    is set (at least one each) -> [T, Nq, R] float32; the queries a block at a time
    (``query_block``)."""
    t, heads, _ = q.shape
    own = latents.ndim == 3
    block = query_block(4 * heads * latents.shape[-2])
    return by_query_blocks(
        t,
        block,
        lambda rows: _rows(q[rows], latents[rows] if own else latents, visible[rows], scale),
        array_module(q),
    )


def _rows(q: Array, latents: Array, visible: Array, scale: float) -> Array:
    xp = array_module(q)
    scores = matmul(q, latents.swapaxes(-1, -2)) * xp.float32(scale)  # [T, Nq, S]
    scores = xp.where(visible[:, None, :], scores, xp.float32(-xp.inf))
    return matmul(softmax(scores), latents)
