"""The vision tower's elementwise and attention math, written once for any numpy-like module.

The text model never needs these: LayerNorm with a bias (the text stack uses zero-centred
RMSNorm), the GELU family (the text MLP is SiLU-gated) and attention without a causal mask or a
K/V cache. The array's own module is used, so a GPU backend runs the same statements.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from ...arrays import array_module

Array = Any

#: Elements of one block of attention scores: queries are taken in chunks so that a large image
#: (thousands of patches, every patch seeing every other) never needs its whole score matrix.
SCORE_BLOCK_ELEMENTS = 1 << 24

#: erfc(z) = t·exp(-z² + P(t)) with t = 1 / (1 + z/2), z >= 0: Numerical Recipes' Chebyshev
#: fit, fractional error below 1.2e-7 everywhere (numpy has no erf; this needs only exp).
_ERFC_COEFFICIENTS = (
    -1.26551223,
    1.00002368,
    0.37409196,
    0.09678418,
    -0.18628806,
    0.27886807,
    -1.13520398,
    1.48851587,
    -0.82215223,
    0.17087277,
)


def layer_norm(x: Array, weight: Array, bias: Array, eps: float) -> Array:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (biased variance,
    as ``torch.nn.LayerNorm``)."""
    xp = array_module(x)
    centred = x - x.mean(axis=-1, keepdims=True)
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / xp.sqrt(variance + xp.float32(eps)) * weight + bias


def erfc(z: Array) -> Array:
    """The complementary error function, to a relative 1.2e-7 (see ``_ERFC_COEFFICIENTS``)."""
    xp = array_module(z)
    a = xp.abs(z)
    t = 1.0 / (1.0 + 0.5 * a)
    poly = xp.zeros_like(t) + _ERFC_COEFFICIENTS[-1]
    for c in reversed(_ERFC_COEFFICIENTS[:-1]):
        poly = poly * t + c
    tail = t * xp.exp(poly - a * a)
    return xp.where(z >= 0, tail, 2.0 - tail)


def gelu_erf(x: Array) -> Array:
    """The exact GELU ``x Φ(x) = x/2 · erfc(-x/√2)`` (``torch.nn.GELU()``, the merger's). The
    erfc form keeps its relative accuracy in the far negative tail, where ``1 + erf`` would
    cancel."""
    return 0.5 * x * erfc(x * -math.sqrt(0.5))


def gelu_tanh(x: Array) -> Array:
    """GELU's tanh approximation (``gelu_pytorch_tanh``, ``gelu_new``; the blocks' MLP)."""
    xp = array_module(x)
    return 0.5 * x * (1.0 + xp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def silu(x: Array) -> Array:
    xp = array_module(x)
    return x * (0.5 * (1.0 + xp.tanh(0.5 * x)))  # the tanh form of the sigmoid never overflows


#: the config's ``hidden_act`` -> the function (transformers' ACT2FN names)
ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "gelu_pytorch_tanh": gelu_tanh,
    "gelu_new": gelu_tanh,
    "gelu": gelu_erf,
    "silu": silu,
}


def softmax(x: Array) -> Array:
    xp = array_module(x)
    e = xp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def segment_attention(q: Array, k: Array, v: Array, bounds: Sequence[int], scale: float) -> Array:
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
