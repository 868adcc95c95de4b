"""The reference math of the non-projection ops, written once for any numpy-like module.

The CPU backend runs these on numpy; the CUDA backend runs the same functions on CuPy arrays
until a dedicated kernel replaces one. The array module comes from the arguments, so there is
one statement of each op: RoPE and attention over the cache. The norms, the delta rule and
the routers are their op families' references (``ops/<family>/reference.py``).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..arrays import array_module
from ..functional import by_query_blocks, query_block, sigmoid, silu, silu_mul
from ..kv_storage import gather_kv, load_kv, store_kv

__all__ = ["sigmoid", "silu"]  # re-exported: backends use ops.sigmoid / ops.silu

Array = Any


def softmax(x: Array) -> Array:
    e = array_module(x).exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def count_pairs(hits: Array | None, top: Array) -> None:
    """Adds each chosen (row, expert) pair of a router's ``top`` [N, k] to ``hits`` [E] int32
    (None: uncounted), on the arrays' device with nothing read back, so a captured step
    counts: on a GPU one launch of atomic adds, which reads no operand from the host."""
    if hits is None:
        return
    xp = array_module(hits)
    if xp is np:
        np.add.at(hits, top.reshape(-1), 1)
    else:
        _pair_counter(xp)(top.reshape(-1), hits)


@functools.cache
def _pair_counter(xp: Any) -> Any:
    return xp.ElementwiseKernel("T e", "raw int32 hits", "atomicAdd(&hits[e], 1)", "count_pairs")


def rope(x: Array, cos: Array, sin: Array) -> Array:
    """NeoX rotate-half on the first ``rd`` dims of each head; the rest pass through."""
    xp = array_module(x)
    rd = cos.shape[-1]
    half = rd // 2
    rot, rest = x[..., :rd], x[..., rd:]
    rotated_half = xp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    rot = rot * cos[:, None, :] + rotated_half * sin[:, None, :]
    return xp.concatenate([rot, rest], axis=-1)


def attention(q: Array, k_cache: Array, v_cache: Array, start: int, scale: float) -> Array:
    """Causal GQA of ``q`` [T, Nq, D] (positions start..start+T-1) over cache rows
    0..start+T-1; a block of queries at a time (``query_block``: their scores bounded at any
    context length), each over the rows it may see."""
    t, nq, _ = q.shape
    block = query_block(2 * 4 * nq * (start + t))  # scores and probabilities
    return by_query_blocks(
        t,
        block,
        lambda rows: _causal(q[rows], k_cache, v_cache, start + rows.start, scale),
        array_module(q),
    )


def _causal(q: Array, k_cache: Array, v_cache: Array, start: int, scale: float) -> Array:
    xp = array_module(q)
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
    xp = array_module(q)
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

    def compile_step(self, fn: Any, shapes: Any, capture: bool = True) -> Any:
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
