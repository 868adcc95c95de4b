"""Our kernels for the delta rule (``backends/cuda/kernels/gdn.cu`` and ``gdn_prefill.cu``;
``kda_decode``, the per-channel-decay variant's decode step, on the same step kernel):
float32 states, compiled convolution widths and key head sizes; value head sizes a multiple of
4 for the chunked form (and so for a prefill, whose lanes share its launches). Launches only:
no synchronisation, so decode and verification can be captured in CUDA graphs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cupy as cp

from ...backends.cuda import gdn, gdn_prefill
from ...backends.cuda.gdn import CONV_TAPS, KEY_DIMS
from ...backends.cuda.gdn_prefill import gdn_chunk as chunk

__all__ = [
    "accepts_chunk",
    "accepts_prefill",
    "accepts_step",
    "chunk",
    "commit",
    "decode",
    "kda_decode",
    "prefill",
    "verify",
]

Array = Any


def accepts_chunk(*, device: str, key_dim: int, value_dim: int, **_: object) -> bool:
    return device == "cuda" and key_dim in KEY_DIMS and value_dim % 4 == 0


def accepts_prefill(*, device: str, taps: int, **key: Any) -> bool:
    """The convolution's compiled widths and our chunk kernels' sizes (a prefill's lanes
    run in their launches together)."""
    return taps in CONV_TAPS and accepts_chunk(device=device, **key)


def accepts_step(*, device: str, taps: int, key_dim: int, **_: object) -> bool:
    return device == "cuda" and taps in CONV_TAPS and key_dim in KEY_DIMS


def prefill(
    mixed: Array,
    kernel: Array,
    conv_states: Array,
    g: Array,
    beta: Array,
    states: Array,
    segments: Sequence[tuple[int, int, int]],
    **dims: int,
) -> Array:
    """Every segment's convolution, SiLU and q/k normalisation in one launch, then the
    chunked form in three, every segment's chunks in each."""
    hk, dk, hv, dv = (dims[n] for n in ("key_heads", "key_dim", "value_heads", "value_dim"))
    segments = tuple(tuple(int(x) for x in seg) for seg in segments)
    q, k, v = gdn_prefill.conv_heads(
        mixed, kernel, conv_states, segments, key_heads=hk, key_dim=dk, value_width=hv * dv
    )
    return gdn_prefill.gdn_chunk_rows(q, k, v.reshape(-1, hv, dv), g, beta, states, segments)


def decode(
    mixed: Array,
    kernel: Array,
    conv_states: Array,
    g: Array,
    beta: Array,
    states: Array,
    slots: Array,
    **dims: int,
) -> Array:
    conv = gdn.conv_step(cp.ascontiguousarray(mixed), kernel, conv_states, slots)
    return gdn.gdn_step(
        conv, cp.ascontiguousarray(g), cp.ascontiguousarray(beta), states, slots, **dims
    )


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
    """``kda_reference.kda_decode`` in two launches: the convolution step with SiLU, then the
    delta rule with one decay a key channel (``kda_step``)."""
    conv = gdn.conv_step(cp.ascontiguousarray(mixed), kernel, conv_states, slots)
    g, beta = cp.ascontiguousarray(g), cp.ascontiguousarray(beta)
    return gdn.kda_step(conv, g, beta, states, slots, heads=heads, head_dim=head_dim)


def verify(
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
    mixed, g, beta = (cp.ascontiguousarray(a) for a in (mixed, g, beta))
    # the lanes' slots are every T-th row's (a strided view): the kernels take them packed
    slots = cp.ascontiguousarray(slots, dtype=cp.int32)
    return gdn.gdn_verify(
        mixed, kernel, conv_states, g, beta, states, slots, records, tokens=tokens, **dims
    )


def commit(
    kernel: Array,
    conv_states: Array,
    states: Array,
    slots: Array,
    records: Any,
    counts: Array,
    **dims: int,
) -> None:
    slots, counts = (cp.ascontiguousarray(cp.asarray(a), cp.int32) for a in (slots, counts))
    gdn.gdn_commit(kernel, conv_states, states, slots, records, counts, **dims)
