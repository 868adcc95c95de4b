"""Array math shared by the models, the op families' references and the backends (elementwise
glue, top-k, query blocks), written once for any numpy-compatible module. It sits below all of
them: it imports nothing of the runtime but ``arrays``.

The array's own namespace is used (``x.__array_namespace__()``: numpy 2, CuPy), so these run
on whichever backend produced ``x`` without the model passing ``xp`` around.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .arrays import array_module

Array = Any


def _sigmoid(x: Array, xp: Any) -> Array:
    # the tanh form never overflows, unlike 1 / (1 + exp(-x)) for very negative x
    return 0.5 * (1.0 + xp.tanh(0.5 * x))


def _silu(x: Array, xp: Any) -> Array:
    return x * _sigmoid(x, xp)


def _silu_mul(x: Array, y: Array, xp: Any) -> Array:
    return _silu(x, xp) * y


def _mul_sigmoid(x: Array, y: Array, xp: Any) -> Array:
    return x * _sigmoid(y, xp)


def _log_decay(x: Array, bias: Array, scale: Array, xp: Any) -> Array:
    return scale * xp.logaddexp(0.0, x + bias)


def _silu_of_quotient(x: Array, d: Array, xp: Any) -> Array:
    return _silu(x / d, xp)


def _add_twice_sigmoid_product(a: Array, z: Array, d: Array, c: Array, xp: Any) -> Array:
    return a + (2.0 * _sigmoid(z / d, xp)) * c


def _add_product(a: Array, b: Array, c: Array, xp: Any) -> Array:
    return a + b * c


def _sigmoid_affine(x: Array, scale: Array, bias: Array, mult: Array, add: Array, xp: Any) -> Array:
    return mult * _sigmoid(x * scale + bias, xp) + add


_FUSED: dict[tuple[str, Any], Any] = {}


def _elementwise(fn: Any, *xs: Array) -> Array:
    """``fn(*xs, xp)``; on a GPU array module compiled into one fused kernel (CuPy would
    launch one kernel per operator), with the same arithmetic."""
    xp = array_module(xs[0])
    fuse = getattr(xp, "fuse", None)
    if fuse is None:
        return fn(*xs, xp)
    key = (fn.__name__, xp)
    if key not in _FUSED:
        _FUSED[key] = fuse(kernel_name=fn.__name__.lstrip("_"))(lambda *v: fn(*v, xp))
    out = _FUSED[key](*xs)
    return out if out.dtype == xs[0].dtype else out.astype(xs[0].dtype)


def sigmoid(x: Array) -> Array:
    return _elementwise(_sigmoid, x)


def silu(x: Array) -> Array:
    return _elementwise(_silu, x)


def silu_mul(x: Array, y: Array) -> Array:
    """``silu(x) * y`` in one pass (the gated MLP's and the GDN output gate's product)."""
    return _elementwise(_silu_mul, x, y)


def mul_sigmoid(x: Array, y: Array) -> Array:
    """``x * sigmoid(y)`` in one pass (the attention output gate)."""
    return _elementwise(_mul_sigmoid, x, y)


def log_decay(x: Array, bias: Array, scale: Array) -> Array:
    """``scale * softplus(x + bias)`` in one pass (Gated DeltaNet's log-decay g)."""
    return _elementwise(_log_decay, x, bias, scale)


def silu_of_quotient(x: Array, d: Array) -> Array:
    """``silu(x / d)`` in one pass (a hyper-connection's low-rank mixer)."""
    return _elementwise(_silu_of_quotient, x, d)


def add_twice_sigmoid_product(a: Array, z: Array, d: Array, c: Array) -> Array:
    """``a + 2 sigmoid(z / d) * c`` in one pass, broadcast (a hyper-connection's inject: its
    weights from their logits z, times the block's output c, into the streams a)."""
    return _elementwise(_add_twice_sigmoid_product, a, z, d, c)


def add_product(a: Array, b: Array, c: Array) -> Array:
    """``a + b * c`` in one pass, broadcast (a hyper-connection's inject into its streams)."""
    return _elementwise(_add_product, a, b, c)


def sigmoid_affine(x: Array, scale: Array, bias: Array, mult: Array, add: Array) -> Array:
    """``mult * sigmoid(x * scale + bias) + add`` in one pass, broadcast (a manifold
    hyper-connection's pre and post weights)."""
    return _elementwise(_sigmoid_affine, x, scale, bias, mult, add)


def l2_normalize(x: Array, eps: float = 1e-6) -> Array:
    """``x / sqrt(sum(x²) + eps)`` over the last axis; the eps sits inside the root."""
    xp = array_module(x)
    return x / xp.sqrt(xp.sum(x * x, axis=-1, keepdims=True) + eps)


#: array math that scores queries against a whole context (the attention and latent
#: attention references, GLM5Next's token indexer, Qwen4Exp's QSA past its budget) reads
#: them a block at a time, each block's scores within about this many bytes: a prefill
#: chunk's would otherwise take gigabytes at a long context (GLM5Next: 64 heads, 2,048
#: queries over 7,680 tokens, 4 GiB), and each query's numbers are the same either way (up
#: to float32 summation order)
SCORE_BLOCK_BYTES = 256 << 20


def query_block(per_query_bytes: int) -> int:
    """How many queries a block reads: their scores within ``SCORE_BLOCK_BYTES``."""
    return max(1, SCORE_BLOCK_BYTES // max(per_query_bytes, 1))


def by_query_blocks(queries: int, block: int, fn: Callable[[slice], Array], xp: Any) -> Array:
    """``fn(rows)`` for the queries ``0 .. queries - 1``, ``block`` of them at a time, stacked
    in order (a single block's result as it is)."""
    if queries <= block:
        return fn(slice(0, queries))
    return xp.concatenate([fn(slice(at, at + block)) for at in range(0, queries, block)])


#: the most comparisons (rows x scores x scores) one ranking of ``top_k_ids`` makes on a
#: device instead of sorting: ranks are elementwise math and sums, where CuPy's sort
#: synchronises with the host (16 MiB of comparisons: GLM5Next's 288 experts at 64 rows; more
#: rows are ranked a share at a time, so only a row wider than it sorts: GLM5Next's pools of
#: 16 tokens past 65,536 tokens). numpy sorts: faster on the host, and the same choice.
RANKED_TOP_K = 1 << 24


def top_k_ids(scores: Array, k: int) -> Array:
    """Scores [T, B] -> int [T, min(k, B)]: each row's ``k`` highest, best first, a tie won
    by the earlier index (as transformers' ``topk`` on the CPU keeps it): on a device by rank
    (``ranked_top_k_ids``), ``ranked_rows`` rows at a time, where a row's ranking fits
    ``RANKED_TOP_K``; else a stable sort (CuPy's sort is always stable, and its older
    releases take no ``kind``)."""
    xp = array_module(scores)
    rows, width = scores.shape
    per_call = ranked_rows(width)
    if xp is not np and per_call:
        return by_query_blocks(rows, per_call, lambda part: ranked_top_k_ids(scores[part], k), xp)
    stable = {"kind": "stable"} if xp is np else {}
    return xp.argsort(-scores, axis=-1, **stable)[:, :k]


def ranked_rows(width: int) -> int:
    """How many rows of ``width`` scores ``top_k_ids`` ranks at once on a device (0: not
    one row; it sorts, which a captured step cannot hold)."""
    return RANKED_TOP_K // (width * width) if width else RANKED_TOP_K


def ranked_top_k_ids(scores: Array, k: int) -> Array:
    """``top_k_ids`` by rank, nothing sorted: score i's rank is how many come before it (a
    higher score, or an equal one at a lower index), and the i of rank r goes to column r."""
    xp = array_module(scores)
    rows, width = scores.shape
    k = min(k, width)
    index = xp.arange(width)
    mine, other = scores[:, :, None], scores[:, None, :]
    earlier = index[None, :] < index[:, None]  # [i, j]: j < i
    rank = ((other > mine) | ((other == mine) & earlier)).sum(axis=-1)  # [T, B]
    ids = xp.zeros((rows, k + 1), dtype=xp.int64)  # column k takes every rank past the top
    ids[xp.arange(rows)[:, None], xp.minimum(rank, k)] = index
    return ids[:, :k]


def top_k_mask(scores: Array, k: int) -> Array:
    """Scores [T, B] -> bool [T, B]: True at each row's ``k`` highest (all of them when there
    are no more), ``top_k_ids``' choice."""
    xp = array_module(scores)
    best = top_k_ids(scores, k)
    chosen = xp.zeros(scores.shape, dtype=bool)
    chosen[xp.arange(scores.shape[0])[:, None], best] = True  # CuPy 13 has no put_along_axis
    return chosen
