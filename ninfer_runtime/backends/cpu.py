"""The float32 numpy reference backend.

Every weight is decoded once to float32 and every op is written in the plainest numpy that
states the math, so this backend is the oracle the CUDA kernels are tested against. Speed is
secondary: BLAS does the matrix products, everything else is vectorised over heads.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .base import Array, MoeWeights, Weight

#: Chunk length of the parallel Gated DeltaNet form (HF and fla use 64; any length is exact).
GDN_CHUNK = 64


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # tanh form: no overflow warning for large |x|, equal to 1/(1+e^-x) up to rounding
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _silu(x: np.ndarray) -> np.ndarray:
    return x * _sigmoid(x)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class CpuBackend:
    """Backend protocol on numpy; a ``Weight`` here is simply a float32 ndarray."""

    name = "cpu"
    xp = np

    # ------------------------------------------------------------------------ weights
    def prepare(self, artifact: Any, names: Iterable[str]) -> dict[str, Weight]:
        return {
            name: np.ascontiguousarray(artifact.parameter(name), dtype=np.float32) for name in names
        }

    def array(self, weight: Weight) -> Array:
        return weight

    # ------------------------------------------------------------------ dense algebra
    def embedding(self, ids: Array, table: Weight) -> Array:
        return table[np.asarray(ids, dtype=np.int64)]  # type: ignore[index]

    def linear(self, x: Array, w: Weight) -> Array:
        return x @ w.T  # type: ignore[attr-defined]

    def rms_norm(self, x: Array, w: Array, eps: float, *, offset: float) -> Array:
        inv = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))
        return (x * inv) * (w + np.float32(offset))

    def rope(self, x: Array, cos: Array, sin: Array) -> Array:
        rd = cos.shape[-1]
        half = rd // 2
        rot, rest = x[..., :rd], x[..., rd:]
        rotated_half = np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
        rot = rot * cos[:, None, :] + rotated_half * sin[:, None, :]
        return np.concatenate([rot, rest], axis=-1)

    # ---------------------------------------------------------------------- attention
    def attention(
        self, q: Array, k_cache: Array, v_cache: Array, *, start: int, scale: float
    ) -> Array:
        t, nq, d = q.shape
        nkv = k_cache.shape[1]
        group = nq // nkv
        s = start + t
        k = k_cache[:s].transpose(1, 2, 0)[:, None]  # [Nkv, 1, D, S]
        v = v_cache[:s].transpose(1, 0, 2)[:, None]  # [Nkv, 1, S, D]
        qg = q.reshape(t, nkv, group, d).transpose(1, 2, 0, 3)  # [Nkv, group, T, D]
        scores = (qg @ k) * np.float32(scale)  # [Nkv, group, T, S]
        visible = np.arange(s)[None, :] <= (start + np.arange(t))[:, None]  # [T, S]
        scores = np.where(visible, scores, -np.inf)
        out = _softmax(scores) @ v  # [Nkv, group, T, D]
        return out.transpose(2, 0, 1, 3).reshape(t, nq, d)

    # ------------------------------------------------------------------ Gated DeltaNet
    def causal_conv(self, x: Array, kernel: Array, state: Array) -> Array:
        taps = kernel.shape[0]
        window = np.concatenate([state.T, x], axis=0)  # [K-1+T, C]
        t = x.shape[0]
        y = np.zeros_like(x)
        for j in range(taps):
            y += kernel[j] * window[j : j + t]
        state[...] = window[t:].T
        return y

    def gdn_chunk(self, q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array) -> Array:
        """Chunked form: inside a chunk the delta-rule writes form a unit-lower-triangular
        system solved at once; between chunks the state carries everything (notes 5.5)."""
        q, k, v, g, beta = _heads_major(q, k, v, g, beta)
        t = v.shape[1]
        out = np.empty_like(v)
        for a in range(0, t, GDN_CHUNK):
            b = min(a + GDN_CHUNK, t)
            out[:, a:b] = _gdn_chunk(
                q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], state
            )
        return out.transpose(1, 0, 2)

    def gdn_step(self, q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array) -> Array:
        """Recurrent form: decay, read what the memory holds for k, write the correction."""
        q, k, v, g, beta = _heads_major(q, k, v, g, beta)
        out = np.empty_like(v)
        for i in range(v.shape[1]):
            state *= np.exp(g[:, i])[:, None, None]
            recalled = np.einsum("hkv,hk->hv", state, k[:, i])
            delta = beta[:, i, None] * (v[:, i] - recalled)
            state += k[:, i, :, None] * delta[:, None, :]
            out[:, i] = np.einsum("hkv,hk->hv", state, q[:, i])
        return out.transpose(1, 0, 2)

    # ---------------------------------------------------------------- mixture of experts
    def _mlp(self, x: Array, gate: Weight, up: Weight, down: Weight) -> Array:
        return self.linear(_silu(self.linear(x, gate)) * self.linear(x, up), down)

    def moe(self, x: Array, weights: MoeWeights) -> Array:
        probs = _softmax(self.linear(x, weights.router))  # [N, E] over all experts
        top = np.argsort(-probs, axis=-1, kind="stable")[:, : weights.top_k]
        share = np.take_along_axis(probs, top, axis=-1)
        share = share / share.sum(axis=-1, keepdims=True)
        out = np.zeros_like(x)
        for e in np.unique(top):
            rows, slot = np.nonzero(top == e)
            ex = weights.experts[int(e)]
            out[rows] += share[rows, slot, None] * self._mlp(x[rows], ex.gate, ex.up, ex.down)
        sh = weights.shared
        score = _sigmoid(self.linear(x, weights.shared_score))  # [N, 1]
        return out + score * self._mlp(x, sh.gate, sh.up, sh.down)


def _heads_major(
    q: Array, k: Array, v: Array, g: Array, beta: Array
) -> tuple[Array, Array, Array, Array, Array]:
    """[T, heads, ...] -> [Hv, T, ...], key heads repeated so value head h reads h // r."""
    group = v.shape[1] // q.shape[1]
    q = np.repeat(q, group, axis=1).transpose(1, 0, 2)
    k = np.repeat(k, group, axis=1).transpose(1, 0, 2)
    return q, k, v.transpose(1, 0, 2), g.T, beta.T


def _gdn_chunk(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array) -> Array:
    """One chunk for all heads: q, k [Hv, C, dk], v [Hv, C, dv], g, beta [Hv, C]."""
    c = v.shape[1]
    gamma = np.cumsum(g, axis=-1)  # [Hv, C] cumulative log-decay inside the chunk
    causal = np.tril(np.ones((c, c), dtype=bool))
    span = np.where(causal, gamma[:, :, None] - gamma[:, None, :], -np.inf)
    decay = np.exp(span)  # D_ij = exp(γ_i − γ_j) for j <= i, else 0
    kk = k @ k.transpose(0, 2, 1)
    a = np.tril(beta[:, :, None] * kk * decay, -1)
    system = np.eye(c, dtype=np.float32) + a  # (I + A) is unit lower triangular
    u = np.linalg.solve(system, beta[:, :, None] * v)
    w = np.linalg.solve(system, (beta * np.exp(gamma))[:, :, None] * k)
    v_new = u - w @ state  # the writes after subtracting what the carried state recalls
    out = (q * np.exp(gamma)[:, :, None]) @ state + ((q @ k.transpose(0, 2, 1)) * decay) @ v_new
    last = gamma[:, -1]
    tail = np.exp(last[:, None] - gamma)[:, :, None] * k  # [Hv, C, dk]
    state *= np.exp(last)[:, None, None]
    state += tail.transpose(0, 2, 1) @ v_new
    return out
