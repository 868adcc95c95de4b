"""The delta rule's oracle, as array math (numpy or CuPy, float32 or float64): the chunked form
``chunk`` (checked against the recurrent ``step``), a lane's prefill, a decode step, and a
speculative round's verification and commit (notes 5.2-5.5). The convolution and the split
into heads are ``conv.py``'s, the verification and commit loops ``loops.py``'s (the KDA
variant, ``kda_reference.py``, shares both)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from ...arrays import array_module
from ...functional import silu
from ..linear import matmul
from .conv import causal_conv, conv_step, split_heads
from .loops import commit_rows, scan, verify_rows

__all__ = [
    "CHUNK",
    "PREFILL_TOLERANCE",
    "TOLERANCE",
    "accepts",
    "chunk",
    "commit",
    "decode",
    "heads_major",
    "prefill",
    "step",
    "step_slots",
    "verify",
]

Array = Any

#: Chunk length of the parallel form (HF and fla use 64; any length is exact).
CHUNK = 64

#: provider -> (rtol, atol as a fraction of the largest reference value): how close each
#: provider's out and state come to this oracle computed in float64 on the same float32
#: inputs (fla's Triton products round their inputs to tf32)
TOLERANCE: dict[str, tuple[float, float]] = {
    "reference": (1e-5, 1e-6),
    "nvrtc": (1e-4, 2e-5),
    "fla": (5e-3, 2e-3),
}
#: provider -> (rtol, atol) of the ``prefill`` op likewise: fla's rounds q, k and v to bf16
#: (the production precision; its largest error in one H100 run, 2,048 rows of the
#: 35B-A3B's heads: 1.06e-2 of the largest value), the others compute as their ``chunk``
PREFILL_TOLERANCE: dict[str, tuple[float, float]] = {**TOLERANCE, "fla": (2e-2, 2e-2)}


def accepts(**_: object) -> bool:
    return True


def heads_major(
    q: Array, k: Array, v: Array, g: Array, beta: Array
) -> tuple[Array, Array, Array, Array, Array]:
    """[T, heads, ...] -> [Hv, T, ...], key heads repeated so value head h reads h // r."""
    xp = array_module(q)
    group = v.shape[1] // q.shape[1]
    q = xp.repeat(q, group, axis=1).transpose(1, 0, 2)
    k = xp.repeat(k, group, axis=1).transpose(1, 0, 2)
    return q, k, v.transpose(1, 0, 2), g.T, beta.T


def step(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array) -> Array:
    """Recurrent form: decay, read what the memory holds for k, write the correction."""
    xp = array_module(q)
    q, k, v, g, beta = heads_major(q, k, v, g, beta)
    out = xp.empty_like(v)
    for i in range(v.shape[1]):
        state *= xp.exp(g[:, i])[:, None, None]
        recalled = xp.einsum("hkv,hk->hv", state, k[:, i])
        delta = beta[:, i, None] * (v[:, i] - recalled)
        state += k[:, i, :, None] * delta[:, None, :]
        out[:, i] = xp.einsum("hkv,hk->hv", state, q[:, i])
    return out.transpose(1, 0, 2)


def chunk(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array) -> Array:
    """Chunked form: inside a chunk the delta-rule writes form a unit-lower-triangular system
    solved at once; between chunks the state carries everything.

    Everything that does not depend on the carried state is computed for all chunks at once
    (batched over a chunk axis, one solve); what is left in sequence is one affine map of the
    state per chunk, S' = M S + N (two array ops). The outputs then follow for all chunks at
    once from the state each chunk started from."""
    xp = array_module(q)
    q, k, v, g, beta = heads_major(q, k, v, g, beta)
    hv, t, dv = v.shape
    if t == 0:
        return xp.empty((0, hv, dv), dtype=v.dtype)
    c = min(CHUNK, t)
    n = -(-t // c)
    q, k, v, g, beta = (_chunked(x, n, c) for x in (q, k, v, g, beta))
    transition, inflow, u, w, qg, qk = _chunk_terms(q, k, v, g, beta)
    starts = xp.empty((n + 1, *state.shape), dtype=state.dtype)  # the state before chunk i
    starts[0] = state
    for i in range(n):
        xp.matmul(transition[i], starts[i], out=starts[i + 1])
        starts[i + 1] += inflow[i]
    state[...] = starts[n]
    starts = starts[:n]  # [n, Hv, dk, dv]
    v_new = u - w @ starts  # the writes after subtracting what the carried state recalls
    out = qg @ starts + qk @ v_new  # [n, Hv, C, dv]
    out = out.transpose(1, 0, 2, 3).reshape(hv, n * c, dv)[:, :t]
    return out.transpose(1, 0, 2)


def _chunked(x: Array, n: int, c: int) -> Array:
    """[Hv, T, ...] -> [n, Hv, C, ...], the last chunk padded with zeros (a zero token has
    g = 0, beta = 0, k = 0: it neither decays nor writes, and its outputs are dropped)."""
    xp = array_module(x)
    hv, t = x.shape[:2]
    if n * c != t:
        padded = xp.zeros((hv, n * c, *x.shape[2:]), dtype=x.dtype)
        padded[:, :t] = x
        x = padded
    return x.reshape(hv, n, c, *x.shape[2:]).swapaxes(0, 1)


def _chunk_terms(
    q: Array, k: Array, v: Array, g: Array, beta: Array
) -> tuple[Array, Array, Array, Array, Array, Array]:
    """The state-independent part of every chunk at once: q, k [n, Hv, C, dk],
    v [n, Hv, C, dv], g, beta [n, Hv, C]. Returns the state map S' = M S + N of each chunk
    (M [n, Hv, dk, dk], N [n, Hv, dk, dv]), u and w with v_new = u - w S, and the output
    terms q exp(γ) and (q kᵀ) ⊙ D with out = q exp(γ) S + ((q kᵀ) ⊙ D) v_new."""
    xp = array_module(q)
    c, dk, dv = k.shape[-2], k.shape[-1], v.shape[-1]
    gamma = xp.cumsum(g, axis=-1)  # [n, Hv, C] cumulative log-decay inside each chunk
    causal = xp.tri(c, c, 0, dtype=bool)
    span = xp.where(causal, gamma[..., :, None] - gamma[..., None, :], xp.float32(-xp.inf))
    decay = xp.exp(span)  # D_ij = exp(γ_i − γ_j) for j <= i, else 0
    k_t = k.swapaxes(-1, -2)
    strictly_lower = xp.tri(c, c, -1, dtype=bool)
    a = xp.where(strictly_lower, beta[..., None] * (k @ k_t) * decay, xp.float32(0))
    system = a + xp.eye(c, dtype=xp.float32)  # (I + A) is unit lower triangular
    growth = xp.exp(gamma)
    rhs = xp.concatenate([beta[..., None] * v, (beta * growth)[..., None] * k], axis=-1)
    uw = xp.linalg.solve(system, rhs)  # one batched solve for u and w of every chunk
    u, w = uw[..., :dv], uw[..., dv:]
    last = gamma[..., -1]  # [n, Hv]
    tail_t = (xp.exp(last[..., None] - gamma)[..., None] * k).swapaxes(-1, -2)  # [n, Hv, dk, C]
    # S' = exp(last) S + tailᵀ (u − w S) = (exp(last) I − tailᵀ w) S + tailᵀ u
    transition = xp.exp(last)[..., None, None] * xp.eye(dk, dtype=xp.float32) - tail_t @ w
    inflow = tail_t @ u
    qg = q * growth[..., None]
    qk = (q @ k_t) * decay
    return transition, inflow, u, w, qg, qk


# ----------------------------------------------------------------------------------------
# Batched decode: one token for each of N lanes, states addressed by pool slot. No host
# synchronisation anywhere (the indices stay on the device), so on CuPy a whole decode step
# can be captured once into a CUDA graph and replayed.


def step_slots(
    q: Array, k: Array, v: Array, g: Array, beta: Array, states: Array, slots: Array
) -> Array:
    """The delta rule of ``step`` for N lanes, one token each: q, k [N, Hk, dk]
    (normalised), v [N, Hv, dv], beta [N, Hv], g [N, Hv] (one decay a head) or [N, Hv, dk]
    (one a key channel: KDA's ``kda_decode``); states [S, Hv, dk, dv] indexed by ``slots``
    (distinct), updated. -> [N, Hv, dv]."""
    xp = array_module(q)
    group = v.shape[1] // q.shape[1]
    q, k = xp.repeat(q, group, axis=1), xp.repeat(k, group, axis=1)
    decay = xp.exp(g).reshape(*g.shape[:2], -1, 1)  # [N, Hv, 1 or dk, 1]
    state = states[slots] * decay  # [N, Hv, dk, dv]
    delta = beta[:, :, None] * (v - _read(state, k))
    state += k[:, :, :, None] * delta[:, :, None, :]
    states[slots] = state
    return _read(state, q)


def _read(state: Array, k: Array) -> Array:
    """Each head's state [N, H, dk, dv] read by its key k [N, H, dk] -> [N, H, dv], as the
    linear family's products (on a device: ones a captured step can hold)."""
    n, h, dk, dv = state.shape
    rows = matmul(k.reshape(n * h, 1, dk), state.reshape(n * h, dk, dv))
    return rows.reshape(n, h, dv)


def decode(
    mixed: Array,
    kernel: Array,
    conv_states: Array,
    g: Array,
    beta: Array,
    states: Array,
    slots: Array,
    *,
    key_heads: int,
    key_dim: int,
    value_heads: int,
    value_dim: int,
) -> Array:
    """One Gated DeltaNet token for each row (notes 5.5): convolution step and SiLU over
    mixed [N, C = 2 Hk dk + Hv dv] = [q | k | v], q and k l2-normalised (q scaled by
    dk^-1/2), then the delta rule on states [S, Hv, dk, dv] float32 indexed by ``slots``
    (distinct); g, beta [N, Hv]. Conv and recurrent states are updated. -> [N, Hv, dv]."""
    conv = silu(conv_step(mixed, kernel, conv_states, slots))
    q, k, v = split_heads(conv, key_heads, key_dim, value_heads, value_dim)
    return step_slots(q, k, v, g, beta, states, slots)


def prefill(
    mixed: Array,
    kernel: Array,
    conv_states: Array,
    g: Array,
    beta: Array,
    states: Array,
    segments: Sequence[tuple[int, int, int]],
    *,
    key_heads: int,
    key_dim: int,
    value_heads: int,
    value_dim: int,
) -> Array:
    """The rows of one or more lanes stacked (notes 5.5): each segment (first row, rows,
    slot) one lane's tokens, continuing its slot of conv_states [S, C, K-1] and states
    [S, Hv, dk, dv] (both updated): the causal convolution of its rows of mixed [N, C] =
    [q | k | v], SiLU, q and k l2-normalised (q scaled by dk^-1/2), then the delta rule in
    the chunked form as the family resolves ``chunk`` (one token: the recurrent form); g,
    beta [N, Hv]. -> [N, Hv, dv] (rows of no segment are zeros)."""
    out = array_module(mixed).zeros((mixed.shape[0], value_heads, value_dim), dtype=states.dtype)
    for first, count, slot in segments:
        rows = slice(first, first + count)
        conv = silu(causal_conv(mixed[rows], kernel, conv_states[slot]))
        q, k, v = split_heads(conv, key_heads, key_dim, value_heads, value_dim)
        out[rows] = scan(
            step, "chunk", q, k, v, g[rows], beta[rows], states[slot], key_dim=key_dim,
            value_dim=value_dim,
        )  # fmt: skip
    return out


#: ``(mixed, kernel, conv_states, g, beta, states, slots, records, *, tokens, **dims)``: a
#: round's ``tokens`` rows of each lane through ``decode`` from unchanged states, their inputs
#: recorded (``loops.verify_rows``)
verify = functools.partial(verify_rows, decode)
#: ``(kernel, conv_states, states, slots, records, counts, **dims)``: the first ``counts[i]``
#: recorded rows of lane i folded into its states (``loops.commit_rows``)
commit = functools.partial(commit_rows, decode)
