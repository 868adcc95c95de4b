"""The norm family's oracle, as array math (numpy or CuPy, float32): RMS norm with the weight's
offset, the residual add fused before it, Gated DeltaNet's output norm gated by silu, and the
Sinkhorn normalisation of a hyper-connection's mixing matrices."""

from __future__ import annotations

from typing import Any

from ...arrays import array_module
from ...backends.array_ops import softmax
from ...functional import silu_mul

__all__ = ["TOLERANCE", "accepts", "add_rms_norm", "gated_rms_norm", "rms_norm", "sinkhorn"]

Array = Any

#: provider -> (rtol, atol as a fraction of the row's largest value) against this oracle
#: computed in float64 on the same float32 inputs (the kernels sum the squares in another
#: order: the bounds tests/gpu/test_glue_kernels.py holds them to)
TOLERANCE: dict[str, tuple[float, float]] = {"reference": (1e-6, 2e-6), "nvrtc": (2e-6, 4e-6)}


def accepts(**_: object) -> bool:
    return True


def rms_norm(x: Array, w: Array, eps: float, offset: float) -> Array:
    """``x / sqrt(mean(x²) + eps) * (w + offset)`` over the last axis."""
    xp = array_module(x)
    inv = 1.0 / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + xp.float32(eps))
    return (x * inv) * (w + xp.float32(offset))


def add_rms_norm(
    h: Array, delta: Array, w: Array, eps: float, offset: float
) -> tuple[Array, Array]:
    """``(s, rms_norm(s, w, eps, offset))`` with ``s = h + delta``."""
    s = h + delta
    return s, rms_norm(s, w, eps, offset)


def gated_rms_norm(x: Array, gate: Array, w: Array, eps: float) -> Array:
    """``silu(gate) * rms_norm(x, w, eps, offset=0)`` over the last axis of x [T, heads, d]."""
    return silu_mul(gate, rms_norm(x, w, eps, 0.0))


def sinkhorn(logits: Array, *, iterations: int, eps: float) -> Array:
    """logits [..., n, n] -> the softmax of each row plus ``eps``, made nearly doubly
    stochastic: the columns normalised, then ``iterations - 1`` rounds of the rows and the
    columns, each sum offset by ``eps``."""
    comb = softmax(logits) + eps
    comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    for _ in range(iterations - 1):
        comb = comb / (comb.sum(axis=-1, keepdims=True) + eps)
        comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
    return comb
