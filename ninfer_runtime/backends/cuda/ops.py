"""The non-projection operations on device arrays, stated as in the CPU reference.

These are the reference math (``backends/cpu.py``) written against CuPy, so the GPU backend
is correct everywhere before anything is fused: norms, RoPE, attention over the cache, the
causal convolution and both Gated DeltaNet forms. Each is a candidate for a dedicated kernel;
none of them touches weights, which stay packed.
"""

from __future__ import annotations

from typing import Any

import cupy as cp

Array = Any

#: chunk length of the parallel Gated DeltaNet form (as the CPU backend)
GDN_CHUNK = 64


def sigmoid(x: Array) -> Array:
    return 0.5 * (1.0 + cp.tanh(0.5 * x))


def silu(x: Array) -> Array:
    return x * sigmoid(x)


def softmax(x: Array) -> Array:
    e = cp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def rms_norm(x: Array, w: Array, eps: float, offset: float) -> Array:
    inv = 1.0 / cp.sqrt(cp.mean(x * x, axis=-1, keepdims=True) + cp.float32(eps))
    return (x * inv) * (w + cp.float32(offset))


def rope(x: Array, cos: Array, sin: Array) -> Array:
    rd = cos.shape[-1]
    half = rd // 2
    rot, rest = x[..., :rd], x[..., rd:]
    rotated_half = cp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    rot = rot * cos[:, None, :] + rotated_half * sin[:, None, :]
    return cp.concatenate([rot, rest], axis=-1)


def attention(q: Array, k_cache: Array, v_cache: Array, start: int, scale: float) -> Array:
    t, nq, d = q.shape
    nkv = k_cache.shape[1]
    group = nq // nkv
    s = start + t
    k = k_cache[:s].transpose(1, 2, 0)[:, None]  # [Nkv, 1, D, S]
    v = v_cache[:s].transpose(1, 0, 2)[:, None]  # [Nkv, 1, S, D]
    qg = q.reshape(t, nkv, group, d).transpose(1, 2, 0, 3)  # [Nkv, group, T, D]
    scores = cp.matmul(qg, k) * cp.float32(scale)  # [Nkv, group, T, S]
    visible = cp.arange(s)[None, :] <= (start + cp.arange(t))[:, None]
    scores = cp.where(visible, scores, cp.float32(-cp.inf))
    out = cp.matmul(softmax(scores), v)  # [Nkv, group, T, D]
    return out.transpose(2, 0, 1, 3).reshape(t, nq, d)


def causal_conv(x: Array, kernel: Array, state: Array) -> Array:
    taps = kernel.shape[0]
    window = cp.concatenate([state.T, x], axis=0)  # [K-1+T, C]
    t = x.shape[0]
    y = cp.zeros_like(x)
    for j in range(taps):
        y += kernel[j] * window[j : j + t]
    state[...] = window[t:].T
    return y


def heads_major(
    q: Array, k: Array, v: Array, g: Array, beta: Array
) -> tuple[Array, Array, Array, Array, Array]:
    """[T, heads, ...] -> [Hv, T, ...], key heads repeated so value head h reads h // r."""
    group = v.shape[1] // q.shape[1]
    q = cp.repeat(q, group, axis=1).transpose(1, 0, 2)
    k = cp.repeat(k, group, axis=1).transpose(1, 0, 2)
    return q, k, v.transpose(1, 0, 2), g.T, beta.T


def gdn_step(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array) -> Array:
    q, k, v, g, beta = heads_major(q, k, v, g, beta)
    out = cp.empty_like(v)
    for i in range(v.shape[1]):
        state *= cp.exp(g[:, i])[:, None, None]
        recalled = cp.einsum("hkv,hk->hv", state, k[:, i])
        delta = beta[:, i, None] * (v[:, i] - recalled)
        state += k[:, i, :, None] * delta[:, None, :]
        out[:, i] = cp.einsum("hkv,hk->hv", state, q[:, i])
    return out.transpose(1, 0, 2)


def gdn_chunk(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array) -> Array:
    q, k, v, g, beta = heads_major(q, k, v, g, beta)
    t = v.shape[1]
    out = cp.empty_like(v)
    for a in range(0, t, GDN_CHUNK):
        b = min(a + GDN_CHUNK, t)
        out[:, a:b] = _gdn_chunk(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], state)
    return out.transpose(1, 0, 2)


def _gdn_chunk(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array) -> Array:
    """One chunk for all heads: q, k [Hv, C, dk], v [Hv, C, dv], g, beta [Hv, C]."""
    c = v.shape[1]
    gamma = cp.cumsum(g, axis=-1)
    causal = cp.tri(c, c, 0, dtype=bool)
    span = cp.where(causal, gamma[:, :, None] - gamma[:, None, :], cp.float32(-cp.inf))
    decay = cp.exp(span)
    kk = cp.matmul(k, k.transpose(0, 2, 1))
    strictly_lower = cp.tri(c, c, -1, dtype=bool)
    a = cp.where(strictly_lower, beta[:, :, None] * kk * decay, cp.float32(0))
    system = cp.eye(c, dtype=cp.float32) + a
    u = cp.linalg.solve(system, beta[:, :, None] * v)
    w = cp.linalg.solve(system, (beta * cp.exp(gamma))[:, :, None] * k)
    v_new = u - cp.matmul(w, state)
    out = cp.matmul(q * cp.exp(gamma)[:, :, None], state) + cp.matmul(
        cp.matmul(q, k.transpose(0, 2, 1)) * decay, v_new
    )
    last = gamma[:, -1]
    tail = cp.exp(last[:, None] - gamma)[:, :, None] * k
    state *= cp.exp(last)[:, None, None]
    state += cp.matmul(tail.transpose(0, 2, 1), v_new)
    return out
