"""The vision tower's elementwise and attention math, written once for any numpy-like module.

The text model never needs these: LayerNorm with a bias (the text stack uses zero-centred
RMSNorm) and the GELU family (the text MLP is SiLU-gated). The array's own module is used, so
a GPU backend runs the same statements. The towers' attention (bidirectional within a frame,
no K/V cache) is the attention family's ``segment`` op (``ops/attention``), resolved here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ...arrays import array_module
from ...errors import ModelError
from ...ops.registry import resolve

Array = Any

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


def checked_activation(name: str) -> str:
    """A vision config's ``hidden_act``, or a ModelError naming the ones ``ACTIVATIONS`` has."""
    if name not in ACTIVATIONS:
        raise ModelError(
            f"vision hidden_act {name!r} is not one of {', '.join(sorted(ACTIVATIONS))}"
        )
    return name


def tower_attention(
    backend: Any, q: Array, k: Array, v: Array, bounds: Sequence[int], scale: float
) -> Array:
    """Bidirectional attention of q, k, v [P, heads, D] within each segment
    ``bounds[i] .. bounds[i+1]`` (one frame of one image): the attention family's ``segment``
    op as ``backend``'s device, prefill precision and the head size resolve it."""
    precision = getattr(backend, "prefill_precision", "float32")
    attend = resolve(
        "attention", "segment", device=backend.name, precision=precision, head_dim=int(q.shape[-1])
    )
    return attend(q, k, v, bounds, scale)
