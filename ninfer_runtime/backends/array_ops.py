"""The reference math of the non-projection ops, written once for any numpy-like module.

The CPU backend runs these on numpy; the CUDA backend runs the same functions on CuPy arrays
until a dedicated kernel replaces one. The array module comes from the arguments, so there is
one statement of each op: RoPE, attention over the cache, the causal convolution and both
Gated DeltaNet forms (notes 5.2-5.5). The norms are the norm family's (``ops/norm``).
"""

from __future__ import annotations

from typing import Any

from ..kv_storage import gather_kv, load_kv, store_kv
from ..models.functional import _xp, l2_normalize, sigmoid, silu, silu_mul

__all__ = ["sigmoid", "silu"]  # re-exported: backends use ops.sigmoid / ops.silu

Array = Any

#: Chunk length of the parallel Gated DeltaNet form (HF and fla use 64; any length is exact).
GDN_CHUNK = 64


def softmax(x: Array) -> Array:
    e = _xp(x).exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def top_k_routing(probs: Array, top_k: int) -> tuple[Array, Array]:
    """A router's choice: each row's ``top_k`` experts by probability (the lower index first
    among equals) -> int [N, k], and their probabilities renormalised to sum 1 over them
    -> [N, k]. One function, so every part of a split block routes alike (the moe family's
    reference ``route``, ``ops/moe``)."""
    xp = _xp(probs)
    top = xp.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
    share = xp.take_along_axis(probs, top, axis=-1)
    return top, share / share.sum(axis=-1, keepdims=True)


def rope(x: Array, cos: Array, sin: Array) -> Array:
    """NeoX rotate-half on the first ``rd`` dims of each head; the rest pass through."""
    xp = _xp(x)
    rd = cos.shape[-1]
    half = rd // 2
    rot, rest = x[..., :rd], x[..., rd:]
    rotated_half = xp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    rot = rot * cos[:, None, :] + rotated_half * sin[:, None, :]
    return xp.concatenate([rot, rest], axis=-1)


def attention(q: Array, k_cache: Array, v_cache: Array, start: int, scale: float) -> Array:
    """Causal GQA of ``q`` [T, Nq, D] (positions start..start+T-1) over cache rows 0..start+T-1."""
    xp = _xp(q)
    t, nq, d = q.shape
    nkv = k_cache.shape[1]
    group = nq // nkv
    s = start + t
    k = k_cache[:s].transpose(1, 2, 0)[:, None]  # [Nkv, 1, D, S]
    v = v_cache[:s].transpose(1, 0, 2)[:, None]  # [Nkv, 1, S, D]
    qg = q.reshape(t, nkv, group, d).transpose(1, 2, 0, 3)  # [Nkv, group, T, D]
    scores = (qg @ k) * xp.float32(scale)  # [Nkv, group, T, S]
    visible = xp.arange(s)[None, :] <= (start + xp.arange(t))[:, None]  # [T, S]
    scores = xp.where(visible, scores, xp.float32(-xp.inf))
    out = softmax(scores) @ v  # [Nkv, group, T, D]
    return out.transpose(2, 0, 1, 3).reshape(t, nq, d)


def attention_pages(
    q: Array, k_pages: Array, v_pages: Array, pages: Array, start: int, scale: float
) -> Array:
    """``attention`` of one lane whose keys/values sit in the paged pools [pages, P, Nkv, D]
    (any storage dtype): token t in page ``pages[t // P]``, row ``t % P``. The rows
    0..start+T-1 are gathered and decoded to float32, then attended exactly as ``attention``
    does."""
    s = start + q.shape[0]
    k, v = gather_kv(k_pages, pages, s), gather_kv(v_pages, pages, s)
    return attention(q, k, v, start, scale)


def causal_conv(x: Array, kernel: Array, state: Array) -> Array:
    """Depthwise causal convolution of x [T, C] with kernel [K, C]; state keeps the last K-1."""
    xp = _xp(x)
    taps = kernel.shape[0]
    window = xp.concatenate([state.T, x], axis=0)  # [K-1+T, C]
    t = x.shape[0]
    y = xp.zeros_like(x)
    for j in range(taps):
        y += kernel[j] * window[j : j + t]
    state[...] = window[t:].T
    return y


def heads_major(
    q: Array, k: Array, v: Array, g: Array, beta: Array
) -> tuple[Array, Array, Array, Array, Array]:
    """[T, heads, ...] -> [Hv, T, ...], key heads repeated so value head h reads h // r."""
    xp = _xp(q)
    group = v.shape[1] // q.shape[1]
    q = xp.repeat(q, group, axis=1).transpose(1, 0, 2)
    k = xp.repeat(k, group, axis=1).transpose(1, 0, 2)
    return q, k, v.transpose(1, 0, 2), g.T, beta.T


def gdn_step(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array) -> Array:
    """Recurrent form: decay, read what the memory holds for k, write the correction."""
    xp = _xp(q)
    q, k, v, g, beta = heads_major(q, k, v, g, beta)
    out = xp.empty_like(v)
    for i in range(v.shape[1]):
        state *= xp.exp(g[:, i])[:, None, None]
        recalled = xp.einsum("hkv,hk->hv", state, k[:, i])
        delta = beta[:, i, None] * (v[:, i] - recalled)
        state += k[:, i, :, None] * delta[:, None, :]
        out[:, i] = xp.einsum("hkv,hk->hv", state, q[:, i])
    return out.transpose(1, 0, 2)


def gdn_chunk(q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array) -> Array:
    """Chunked form: inside a chunk the delta-rule writes form a unit-lower-triangular system
    solved at once; between chunks the state carries everything.

    Everything that does not depend on the carried state is computed for all chunks at once
    (batched over a chunk axis, one solve); what is left in sequence is one affine map of the
    state per chunk, S' = M S + N (two array ops). The outputs then follow for all chunks at
    once from the state each chunk started from."""
    xp = _xp(q)
    q, k, v, g, beta = heads_major(q, k, v, g, beta)
    hv, t, dv = v.shape
    if t == 0:
        return xp.empty((0, hv, dv), dtype=v.dtype)
    c = min(GDN_CHUNK, t)
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
    xp = _xp(x)
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
    xp = _xp(q)
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


def kv_write(
    k_pages: Array,
    v_pages: Array,
    page_table: Array,
    slots: Array,
    positions: Array,
    k: Array,
    v: Array,
) -> None:
    """Store each row's key/value at its position: page ``page_table[slot, pos // P]``, row
    ``pos % P`` of the pools [pages, P, Nkv, D]."""
    p = k_pages.shape[1]
    pages = page_table[slots, positions // p]
    k_pages[pages, positions % p] = store_kv(k, k_pages.dtype)
    v_pages[pages, positions % p] = store_kv(v, v_pages.dtype)


def attention_decode(
    q: Array,
    k_pages: Array,
    v_pages: Array,
    page_table: Array,
    slots: Array,
    positions: Array,
    scale: float,
) -> Array:
    """q [N, Nq, D]: row i attends over tokens 0..positions[i] of the sequence in slot
    ``slots[i]``, whose keys/values sit in the pages ``page_table[slots[i]]`` of the pools
    [pages, P, Nkv, D]. GQA: query head j reads kv head ``j // (Nq / Nkv)``. -> [N, Nq, D]."""
    xp = _xp(q)
    n, nq, d = q.shape
    p, nkv = k_pages.shape[1], k_pages.shape[2]
    group = nq // nkv
    pages = page_table[slots]  # [N, max_pages]: every page the table can name (static shape)
    s = pages.shape[1] * p
    k = load_kv(k_pages[pages]).reshape(n, s, nkv, d).transpose(0, 2, 3, 1)
    v = load_kv(v_pages[pages]).reshape(n, s, nkv, d).transpose(0, 2, 1, 3)
    qg = q.reshape(n, nkv, group, 1, d)
    scores = (qg @ k[:, :, None]) * xp.float32(scale)  # [N, Nkv, group, 1, S]
    visible = xp.arange(s)[None, :] <= positions[:, None]  # [N, S]
    scores = xp.where(visible[:, None, None, None, :], scores, xp.float32(-xp.inf))
    out = softmax(scores) @ v[:, :, None]  # [N, Nkv, group, 1, D]
    return out.reshape(n, nq, d)


def conv_step(x: Array, kernel: Array, conv_states: Array, slots: Array) -> Array:
    """One token of the depthwise causal convolution for each row: x [N, C], kernel [K, C],
    conv_states [S, C, K-1] (the last K-1 inputs of each slot, updated). No activation."""
    xp = _xp(x)
    window = xp.concatenate([conv_states[slots], x[:, :, None]], axis=2)  # [N, C, K]
    conv_states[slots] = window[:, :, 1:]
    return (window * kernel.T[None]).sum(axis=2)


def gdn_decode(
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
    q, k, v = gdn_heads(conv, key_heads, key_dim, value_heads, value_dim)
    return gdn_step_slots(q, k, v, g, beta, states, slots)


def gdn_heads(
    conv: Array, key_heads: int, key_dim: int, value_heads: int, value_dim: int
) -> tuple[Array, Array, Array]:
    """Convolved channels [N, q | k | v] -> q, k [N, Hk, dk] l2-normalised (q scaled by
    dk^-1/2) and v [N, Hv, dv]."""
    n, width = conv.shape[0], key_heads * key_dim
    q = l2_normalize(conv[:, :width].reshape(n, key_heads, key_dim)) * key_dim**-0.5
    k = l2_normalize(conv[:, width : 2 * width].reshape(n, key_heads, key_dim))
    return q, k, conv[:, 2 * width :].reshape(n, value_heads, value_dim)


def gdn_prefill(
    mixed: Array,
    kernel: Array,
    conv_state: Array,
    g: Array,
    beta: Array,
    state: Array,
    *,
    key_heads: int,
    key_dim: int,
    value_heads: int,
    value_dim: int,
) -> Array:
    """T tokens of one lane (notes 5.5): the causal convolution of mixed [T, C] = [q | k | v]
    continuing conv_state [C, K-1], SiLU, q and k l2-normalised (q scaled by dk^-1/2), then
    the delta rule from state [Hv, dk, dv] in the chunked form (one token: the recurrent
    one); g, beta [T, Hv]. Both states are updated. -> [T, Hv, dv]."""
    conv = silu(causal_conv(mixed, kernel, conv_state))
    q, k, v = gdn_heads(conv, key_heads, key_dim, value_heads, value_dim)
    if mixed.shape[0] == 1:
        return gdn_step(q, k, v, g, beta, state)
    from ..ops.registry import resolve  # the op catalogue sits above the array math

    device = "cpu" if _xp(mixed).__name__ == "numpy" else "cuda"
    chunk = resolve("delta_rule", "chunk", device=device, key_dim=key_dim, value_dim=value_dim)
    return chunk(q, k, v, g, beta, state)


def gdn_verify(
    mixed: Array,
    kernel: Array,
    conv_states: Array,
    g: Array,
    beta: Array,
    states: Array,
    slots: Array,
    records: Any,
    *,
    tokens: int,
    **dims: int,
) -> Array:
    """``tokens`` consecutive tokens of each lane through ``gdn_decode``, one after the other,
    from the lanes' states, **without changing them**: rows are lane-major (lane i is rows
    i*T .. i*T+T-1), ``slots`` [lanes] the lanes' slots. The rows' inputs (mixed, g, beta)
    are kept in ``records`` (``GdnDrafts``) for ``gdn_commit``. -> [N, Hv, dv]."""
    xp = _xp(mixed)
    lanes = slots.shape[0]
    per_lane = [x.reshape(lanes, tokens, *x.shape[1:]) for x in (mixed, g, beta)]
    for stored, x in zip((records.mixed, records.g, records.beta), per_lane, strict=True):
        stored[slots, :tokens] = x
    conv, state, local = conv_states[slots], states[slots], xp.arange(lanes)  # copies
    m, gs, bs = (xp.ascontiguousarray(x.swapaxes(0, 1)) for x in per_lane)  # token-major
    out = [
        gdn_decode(m[j], kernel, conv, gs[j], bs[j], state, local, **dims) for j in range(tokens)
    ]
    return xp.stack(out, axis=1).reshape(lanes * tokens, *out[0].shape[1:])


def gdn_commit(
    kernel: Array,
    conv_states: Array,
    states: Array,
    slots: Array,
    records: Any,
    counts: Array,
    **dims: int,
) -> None:
    """Fold the first ``counts[i]`` tokens ``gdn_verify`` recorded for lane i (slot
    ``slots[i]``) into its conv and recurrent states, token by token through ``gdn_decode``:
    the states end exactly as decoding those tokens one at a time leaves them. Every
    recorded row runs for every lane and is kept where ``j < counts[i]``, so ``counts`` is
    never read on the host."""
    xp = _xp(states)
    keep = xp.asarray(counts)[:, None] > xp.arange(records.mixed.shape[1])[None, :]
    conv, state, local = conv_states[slots], states[slots], xp.arange(slots.shape[0])  # copies
    for j in range(records.mixed.shape[1]):
        conv_j, state_j = conv.copy(), state.copy()
        gdn_decode(
            records.mixed[slots, j],
            kernel,
            conv_j,
            records.g[slots, j],
            records.beta[slots, j],
            state_j,
            local,
            **dims,
        )
        conv = xp.where(keep[:, j, None, None], conv_j, conv)
        state = xp.where(keep[:, j, None, None, None], state_j, state)
    conv_states[slots] = conv
    states[slots] = state


def gdn_step_slots(
    q: Array, k: Array, v: Array, g: Array, beta: Array, states: Array, slots: Array
) -> Array:
    """The delta rule of ``gdn_step`` for N lanes, one token each: q, k [N, Hk, dk]
    (normalised), v [N, Hv, dv], g, beta [N, Hv]; states [S, Hv, dk, dv] indexed by
    ``slots`` (distinct), updated. -> [N, Hv, dv]."""
    xp = _xp(q)
    group = v.shape[1] // q.shape[1]
    q, k = xp.repeat(q, group, axis=1), xp.repeat(k, group, axis=1)
    state = states[slots] * xp.exp(g)[:, :, None, None]  # [N, Hv, dk, dv]
    recalled = xp.einsum("nhkv,nhk->nhv", state, k)
    delta = beta[:, :, None] * (v - recalled)
    state += k[:, :, :, None] * delta[:, :, None, :]
    states[slots] = state
    return xp.einsum("nhkv,nhk->nhv", state, q)


class ReferenceOps:
    """The backend methods both backends take from this module as they are: mixed into a
    backend class that provides ``linear`` (the GPU backend overrides these one by one as
    kernels replace them)."""

    linear: Any
    name: str
    xp: Any

    def context_budget(self, headroom: int | None = None) -> int | None:
        """Bytes the context pool may take (``--context-capacity auto``); None: no limit."""
        return None

    def device_sampler(self) -> Any:
        """A sampler that picks tokens where the logits are (None: the host samples)."""
        return None

    def compile_step(self, fn: Any, shapes: Any) -> Any:
        """A step taking host index arrays; run eagerly (a GPU backend captures it)."""
        xp = self.xp

        def step(*host: Any) -> Any:
            out = fn(*(xp.asarray(a) for a in host))
            return () if out is None else out  # as a captured step

        return step

    def gated_linear(self, gate_up: Array, w: Any) -> Array:
        gate, up = self.xp.split(gate_up, 2, axis=-1)
        return self.linear(silu_mul(gate, up), w)

    # the reference function itself (its signature is the protocol's, base.py)
    rope = staticmethod(rope)
