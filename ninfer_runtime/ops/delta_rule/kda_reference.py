"""The delta rule with a per-channel decay (Kimi Delta Attention, KDA), as array math (numpy or
CuPy, float32 or float64): the oracle of the family's ``kda_*`` ops.

KDA is Gated DeltaNet's recurrence with the scalar decay of a head replaced by one decay per
key channel; everything else (the write strength, the delta correction, the read) is the same:

    S_t = diag(exp(g_t)) S_{t-1};  S_t += k_t (beta_t (v_t - S_tᵀ k_t))ᵀ;  o_t = S_tᵀ q_t

with q, k, v [T, H, d] (query, key and value heads alike), log-decay g [T, H, dk] (<= 0),
beta [T, H] and the state [H, dk, dv] float32.

The chunked form (``kda_chunk``) solves each chunk's writes at once, as ``reference.chunk``
does; the pairwise decays exp(γ_i - γ_j) now differ per channel, so the chunk's key-key and
query-key products are taken over [C, C, dk] (a factorisation exp(γ_i)·exp(-γ_j) would
overflow once a chunk's decays add up past float32's range). Chunks therefore stay short and
run one after another. The convolution, the split into heads, the decode step on states by
slot (``reference.step_slots``, which takes a decay a key channel) and the loops of a prefill,
a verification and a commit are Gated DeltaNet's (``conv.py``, ``loops.py``).
"""

from __future__ import annotations

import functools
from typing import Any

from ...arrays import array_module
from ...functional import silu
from .conv import causal_conv, conv_step, split_heads
from .loops import commit_rows, scan, verify_rows
from .reference import step_slots

__all__ = [
    "KDA_CHUNK",
    "accepts",
    "kda_chunk",
    "kda_commit",
    "kda_decode",
    "kda_prefill",
    "kda_step",
    "kda_verify",
]

Array = Any

#: tokens a chunk (the pairwise-decay products are [H, C, C, dk] per chunk; any length is exact)
KDA_CHUNK = 32


def accepts(**_: object) -> bool:
    return True


def kda_step(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array) -> Array:
    """The recurrent form, token by token: q, k, v [T, H, d], g [T, H, dk], beta [T, H];
    state [H, dk, dv] updated in place. -> [T, H, dv]."""
    xp = array_module(q)
    out = xp.empty(v.shape, dtype=v.dtype)
    for t in range(v.shape[0]):
        state *= xp.exp(g[t])[:, :, None]
        recalled = xp.einsum("hkv,hk->hv", state, k[t])
        delta = beta[t, :, None] * (v[t] - recalled)
        state += k[t, :, :, None] * delta[:, None, :]
        out[t] = xp.einsum("hkv,hk->hv", state, q[t])
    return out


def kda_chunk(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array) -> Array:
    """The chunked form of ``kda_step`` (same arguments, same result to rounding)."""
    xp = array_module(q)
    q, k, v, g = (x.transpose(1, 0, 2) for x in (q, k, v, g))  # [H, T, ...]
    beta = beta.T
    out = xp.empty(v.shape, dtype=v.dtype)
    for a in range(0, v.shape[1], KDA_CHUNK):
        c = slice(a, a + KDA_CHUNK)
        out[:, c] = _one_chunk(q[:, c], k[:, c], v[:, c], g[:, c], beta[:, c], state)
    return out.transpose(1, 0, 2)


def _one_chunk(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array) -> Array:
    """One chunk of C tokens, heads first (q, k [H, C, dk], v [H, C, dv], g [H, C, dk],
    beta [H, C]), from ``state`` [H, dk, dv], which is advanced in place.

    With γ the cumulative log-decay inside the chunk, the writes δ_i = beta_i (v_i − S_iᵀ k_i)
    satisfy (I + A) δ = beta v − beta (k ⊙ exp γ) S with A_ij = beta_i Σ_c k_ic k_jc
    exp(γ_ic − γ_jc) (j < i): so δ = u − w S for u, w from one solve. Then
    o_i = (q_i ⊙ exp γ_i) S + Σ_{j<=i} (Σ_c q_ic k_jc exp(γ_ic − γ_jc)) δ_j and the state
    leaves as diag(exp γ_last) S + Σ_j (k_j ⊙ exp(γ_last − γ_j)) δ_jᵀ."""
    xp = array_module(q)
    c, dv = v.shape[1], v.shape[2]
    gamma = xp.cumsum(g, axis=1)  # [H, C, dk]
    causal = xp.tri(c, c, 0, dtype=bool)[None, :, :, None]
    span = gamma[:, :, None, :] - gamma[:, None, :, :]  # [H, C(i), C(j), dk]
    decay = xp.exp(xp.where(causal, span, xp.asarray(-xp.inf, dtype=span.dtype)))
    key_key = (k[:, :, None, :] * k[:, None, :, :] * decay).sum(axis=-1)  # [H, C, C]
    query_key = (q[:, :, None, :] * k[:, None, :, :] * decay).sum(axis=-1)
    strictly_lower = xp.tri(c, c, -1, dtype=bool)
    a = xp.where(strictly_lower, beta[:, :, None] * key_key, xp.zeros((), dtype=v.dtype))
    system = a + xp.eye(c, dtype=v.dtype)
    growth = xp.exp(gamma)
    rhs = xp.concatenate([beta[..., None] * v, beta[..., None] * growth * k], axis=-1)
    uw = xp.linalg.solve(system, rhs)
    u, w = uw[..., :dv], uw[..., dv:]
    writes = u - w @ state  # δ [H, C, dv]
    out = (q * growth) @ state + query_key @ writes
    last = gamma[:, -1]  # [H, dk]
    tail = xp.exp(last[:, None, :] - gamma) * k  # [H, C, dk]
    state *= xp.exp(last)[:, :, None]
    state += tail.swapaxes(1, 2) @ writes
    return out


def kda_prefill(
    mixed: Array,
    kernel: Array,
    conv_state: Array,
    g: Array,
    beta: Array,
    state: Array,
    *,
    heads: int,
    head_dim: int,
) -> Array:
    """T tokens of one lane: the causal convolution of mixed [T, 3·H·d] = [q | k | v]
    continuing conv_state [C, K-1], SiLU, q and k l2-normalised (q scaled), then the delta rule
    from state [H, d, d] (one token: the recurrent form); g [T, H, d], beta [T, H]. Both
    states are updated. -> [T, H, d]."""
    conv = silu(causal_conv(mixed, kernel, conv_state))
    q, k, v = split_heads(conv, heads, head_dim, heads, head_dim)
    dims = {"key_dim": head_dim, "value_dim": head_dim}
    return scan(kda_step, "kda_chunk", q, k, v, g, beta, state, **dims)


def kda_decode(
    mixed: Array,
    kernel: Array,
    conv_states: Array,
    g: Array,
    beta: Array,
    states: Array,
    slots: Array,
    *,
    heads: int,
    head_dim: int,
) -> Array:
    """One token for each row: the convolution step and SiLU over mixed [N, 3·H·d], then the
    delta rule on states [S, H, d, d] indexed by ``slots`` (distinct); g [N, H, d],
    beta [N, H]. Conv and recurrent states are updated. -> [N, H, d]."""
    conv = silu(conv_step(mixed, kernel, conv_states, slots))
    q, k, v = split_heads(conv, heads, head_dim, heads, head_dim)
    return step_slots(q, k, v, g, beta, states, slots)


#: ``(mixed, kernel, conv_states, g, beta, states, slots, records, *, tokens, **dims)``: a
#: round's ``tokens`` rows of each lane through ``kda_decode`` from unchanged states, their
#: inputs recorded (``loops.verify_rows``)
kda_verify = functools.partial(verify_rows, kda_decode)
#: ``(kernel, conv_states, states, slots, records, counts, **dims)``: the first ``counts[i]``
#: recorded rows of lane i folded into its states (``loops.commit_rows``)
kda_commit = functools.partial(commit_rows, kda_decode)
