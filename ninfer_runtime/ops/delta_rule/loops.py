"""The loops both variants of the delta rule (Gated DeltaNet, ``reference.py``; KDA,
``kda_reference.py``) run the same way around their own math: a lane's tokens in the
recurrent or the chunked form, and a speculative round's verification and commit, token by
token through the variant's decode step. Written once, each parameterised by that step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...arrays import array_module
from ..registry import resolve

__all__ = ["commit_rows", "scan", "verify_rows"]

Array = Any
#: a variant's decode step: ``(mixed, kernel, conv_states, g, beta, states, slots, **dims)``
Decode = Callable[..., Array]


def scan(
    step: Callable[..., Array],
    chunk_op: str,
    q: Array,
    k: Array,
    v: Array,
    g: Array,
    beta: Array,
    state: Array,
    *,
    key_dim: int,
    value_dim: int,
) -> Array:
    """One lane's T tokens from ``state`` (updated): one token in the recurrent form
    ``step``, more in the family's ``chunk_op`` as its policy resolves it for the arrays'
    device."""
    if v.shape[0] == 1:
        return step(q, k, v, g, beta, state)
    device = "cpu" if array_module(v).__name__ == "numpy" else "cuda"
    chunk = resolve("delta_rule", chunk_op, device=device, key_dim=key_dim, value_dim=value_dim)
    return chunk(q, k, v, g, beta, state)


def verify_rows(
    decode: Decode,
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
    """``tokens`` consecutive rows of each lane through ``decode``, one after the other, from
    the lanes' states **without changing them**: rows are lane-major (lane i is rows
    i*T .. i*T+T-1), ``slots`` [lanes] the lanes' slots. The rows' inputs (mixed, g, beta)
    are kept in ``records`` (the memory kind's ``GdnDrafts``) for ``commit_rows``."""
    xp = array_module(mixed)
    lanes = slots.shape[0]
    per_lane = [x.reshape(lanes, tokens, *x.shape[1:]) for x in (mixed, g, beta)]
    for stored, x in zip((records.mixed, records.g, records.beta), per_lane, strict=True):
        stored[slots, :tokens] = x
    conv, state, local = conv_states[slots], states[slots], xp.arange(lanes)  # copies
    m, gs, bs = (xp.ascontiguousarray(x.swapaxes(0, 1)) for x in per_lane)  # token-major
    out = [decode(m[j], kernel, conv, gs[j], bs[j], state, local, **dims) for j in range(tokens)]
    return xp.stack(out, axis=1).reshape(lanes * tokens, *out[0].shape[1:])


def commit_rows(
    decode: Decode,
    kernel: Array,
    conv_states: Array,
    states: Array,
    slots: Array,
    records: Any,
    counts: Array,
    **dims: int,
) -> None:
    """Fold the first ``counts[i]`` rows ``verify_rows`` recorded for lane i (slot
    ``slots[i]``) into its conv and recurrent states, row by row through ``decode``: the
    states end exactly as decoding those tokens one at a time leaves them. Every recorded row
    runs for every lane and is kept where ``j < counts[i]``, so ``counts`` is never read on
    the host."""
    xp = array_module(states)
    keep = xp.asarray(counts)[:, None] > xp.arange(records.mixed.shape[1])[None, :]
    conv, state, local = conv_states[slots], states[slots], xp.arange(slots.shape[0])  # copies
    for j in range(records.mixed.shape[1]):
        conv_j, state_j = conv.copy(), state.copy()
        m, gj, bj = records.mixed[slots, j], records.g[slots, j], records.beta[slots, j]
        decode(m, kernel, conv_j, gj, bj, state_j, local, **dims)
        conv = xp.where(keep[:, j, None, None], conv_j, conv)
        state = xp.where(keep[:, j, None, None, None], state_j, state)
    conv_states[slots] = conv
    states[slots] = state
