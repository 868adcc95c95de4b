"""Elementwise glue shared by model files, written once for any numpy-compatible module.

The array's own namespace is used (``x.__array_namespace__()``: numpy 2, CuPy), so these run
on whichever backend produced ``x`` without the model passing ``xp`` around.
"""

from __future__ import annotations

from typing import Any

from ..arrays import array_module

Array = Any


_xp = array_module


def _sigmoid(x: Array, xp: Any) -> Array:
    # the tanh form never overflows, unlike 1 / (1 + exp(-x)) for very negative x
    return 0.5 * (1.0 + xp.tanh(0.5 * x))


def _silu(x: Array, xp: Any) -> Array:
    return x * _sigmoid(x, xp)


_FUSED: dict[tuple[str, Any], Any] = {}


def _elementwise(fn: Any, x: Array) -> Array:
    """``fn(x, xp)``; on a GPU array module compiled into one fused kernel (CuPy would launch
    one kernel per operator), with the same arithmetic."""
    xp = _xp(x)
    fuse = getattr(xp, "fuse", None)
    if fuse is None:
        return fn(x, xp)
    key = (fn.__name__, xp)
    if key not in _FUSED:
        _FUSED[key] = fuse(kernel_name=fn.__name__.lstrip("_"))(lambda v: fn(v, xp))
    out = _FUSED[key](x)
    return out if out.dtype == x.dtype else out.astype(x.dtype)


def sigmoid(x: Array) -> Array:
    return _elementwise(_sigmoid, x)


def silu(x: Array) -> Array:
    return _elementwise(_silu, x)


def softplus(x: Array) -> Array:
    return _xp(x).logaddexp(0.0, x)


def l2_normalize(x: Array, eps: float = 1e-6) -> Array:
    """``x / sqrt(sum(x²) + eps)`` over the last axis; the eps sits inside the root."""
    xp = _xp(x)
    return x / xp.sqrt(xp.sum(x * x, axis=-1, keepdims=True) + eps)
