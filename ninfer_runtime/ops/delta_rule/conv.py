"""The delta rule's input side, shared by Gated DeltaNet and its per-channel-decay variant
(KDA): the depthwise causal convolution of the projected [q | k | v] channels, over a lane's
T tokens or one token a lane with states by slot, and the split of the convolved channels into
l2-normalised heads. Array math (numpy or CuPy, float32 or float64)."""

from __future__ import annotations

from typing import Any

from ...arrays import array_module
from ...functional import l2_normalize

__all__ = ["causal_conv", "conv_step", "split_heads"]

Array = Any


def causal_conv(x: Array, kernel: Array, state: Array) -> Array:
    """Depthwise causal convolution of x [T, C] with kernel [K, C]; state keeps the last K-1."""
    xp = array_module(x)
    taps = kernel.shape[0]
    window = xp.concatenate([state.T, x], axis=0)  # [K-1+T, C]
    t = x.shape[0]
    y = xp.zeros_like(x)
    for j in range(taps):
        y += kernel[j] * window[j : j + t]
    state[...] = window[t:].T
    return y


def conv_step(x: Array, kernel: Array, conv_states: Array, slots: Array) -> Array:
    """One token of the depthwise causal convolution for each row: x [N, C], kernel [K, C],
    conv_states [S, C, K-1] (the last K-1 inputs of each slot, updated). No activation."""
    xp = array_module(x)
    window = xp.concatenate([conv_states[slots], x[:, :, None]], axis=2)  # [N, C, K]
    conv_states[slots] = window[:, :, 1:]
    return (window * kernel.T[None]).sum(axis=2)


def split_heads(
    conv: Array, key_heads: int, key_dim: int, value_heads: int, value_dim: int
) -> tuple[Array, Array, Array]:
    """Convolved channels [N, q | k | v] -> q, k [N, Hk, dk] l2-normalised (q scaled by
    dk^-1/2) and v [N, Hv, dv]."""
    n, width = conv.shape[0], key_heads * key_dim
    q = l2_normalize(conv[:, :width].reshape(n, key_heads, key_dim)) * key_dim**-0.5
    k = l2_normalize(conv[:, width : 2 * width].reshape(n, key_heads, key_dim))
    return q, k, conv[:, 2 * width :].reshape(n, value_heads, value_dim)
