"""Launchers of the Gated DeltaNet prefill (``kernels/gdn_prefill.cu``), one lane's T tokens
as the delta_rule reference's ``prefill``: ``conv_heads`` (the convolution, SiLU and the q/k
normalisation, one launch) and ``gdn_chunk`` (the delta rule in the chunked form, in three
launches: what each chunk needs without the state, for all chunks at once; the state through
the chunks in order; the outputs, all chunks at once). Launches only: no synchronisation and
no device reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .compile import function, register_family
from .gdn import CONV_TAPS, KEY_DIMS  # the decode kernels' sizes: one set for both

FAMILY = "gdn_prefill"
#: must match GC, GDN_CHUNK_THREADS and GdnChunk<DK>::SC / OC in the kernel
CHUNK = 64
THREADS = 256
STATE_COLUMNS = 32
OUTPUT_COLUMNS = 64

CONV_THREADS = 256  # GDN_CONV_THREADS in the kernel
CONV_TOKENS = 8  # GDN_CONV_TOKENS: a block's tokens

register_family(
    FAMILY,
    [f"gdn_prefill_conv<{taps}, {vec}>" for taps in CONV_TAPS for vec in (1, 4)]
    + [
        f"{name}<{d}>"
        for name in ("gdn_chunk_prepare", "gdn_chunk_states", "gdn_chunk_output")
        for d in KEY_DIMS
    ],
    needs=("gdn",),
)

__all__ = ["conv_heads", "gdn_chunk", "shared_bytes", "supported"]


def conv_heads(
    mixed: Any, kernel: Any, conv_state: Any, *, key_heads: int, key_dim: int, value_width: int
) -> tuple[Any, Any, Any]:
    """One lane's rows mixed [T, >= C] (the [q | k | v] channels first; rows may be a wider
    array's) through the causal convolution continuing conv_state [C, K-1] (updated), SiLU,
    and the split into heads -> q, k [T, Hk, dk] (l2-normalised, q scaled by dk^-1/2) and
    v [T, C - 2 Hk dk] float32. A block per 8 tokens and slice of channels (whole key heads),
    four channels a thread in float4 where every row and pointer is 16-byte aligned, else
    one."""
    import cupy as cp

    taps, channels = kernel.shape
    t = mixed.shape[0]
    if (
        taps not in CONV_TAPS
        or conv_state.shape != (channels, taps - 1)
        or conv_state.dtype != np.float32
        or not conv_state.flags.c_contiguous
    ):
        raise ValueError(
            f"conv_heads: kernel {kernel.shape}, conv_state {conv_state.dtype} "
            f"{conv_state.shape}: expected [K, C] with K in {CONV_TAPS} and a C-contiguous "
            "float32 [C, K-1] state"
        )
    if channels != 2 * key_heads * key_dim + value_width or mixed.shape[1] < channels:
        raise ValueError(f"conv_heads: mixed {mixed.shape} has not the {channels} channels")
    if mixed.dtype != np.float32 or mixed.strides[1] != 4:
        mixed = cp.ascontiguousarray(mixed, dtype=cp.float32)
    kernel = cp.ascontiguousarray(kernel, dtype=cp.float32)
    q = cp.empty((t, key_heads, key_dim), dtype=cp.float32)
    k = cp.empty((t, key_heads, key_dim), dtype=cp.float32)
    v = cp.empty((t, value_width), dtype=cp.float32)
    if t == 0:
        return q, k, v
    row_stride = mixed.strides[0] // 4
    aligned = (
        mixed.data.ptr % 16 == 0
        and kernel.data.ptr % 16 == 0
        and row_stride % 4 == 0
        and key_dim % 4 == 0
        and value_width % 4 == 0  # with key_dim: channels and every output row
    )
    vec = 4 if aligned else 1
    # a multiple of key_dim about a block wide, so that no key head straddles two blocks
    unit = max(key_dim, 1)
    slice_ = unit * max(1, vec * CONV_THREADS // unit)
    shared = 4 * CONV_TOKENS * slice_
    function(FAMILY, f"gdn_prefill_conv<{taps}, {vec}>", shared=shared)(
        (-(-t // CONV_TOKENS), -(-channels // slice_)),
        (CONV_THREADS,),
        (
            mixed,
            np.int64(row_stride),
            kernel,
            conv_state,
            np.int32(t),
            np.int32(key_heads),
            np.int32(key_dim),
            np.int32(value_width),
            np.int32(slice_),
            q,
            k,
            v,
        ),
        shared_mem=shared,
    )
    # after the launch (stream order): the state becomes the window's last K-1 inputs, all of
    # them this lane's rows when it has that many (one copy)
    keep = taps - 1
    if t >= keep:
        conv_state[...] = mixed[t - keep :, :channels].T
    else:
        window = cp.concatenate([conv_state.T, mixed[:, :channels]])
        conv_state[...] = window[-keep:].T
    return q, k, v


def supported(q: Any, k: Any, v: Any, state: Any) -> bool:
    """Whether the kernels take these arrays (else the reference runs): a compiled key head
    size, a value head size that is a multiple of 4."""
    return (
        getattr(q, "ndim", None) == 3
        and q.shape[2] in KEY_DIMS
        and k.shape == q.shape
        and v.ndim == 3
        and v.shape[2] % 4 == 0
        and v.shape[1] % q.shape[1] == 0
        and state.shape == (v.shape[1], q.shape[2], v.shape[2])
        and all(a.dtype == np.float32 for a in (q, k, v, state))
        and state.flags.c_contiguous
        and state.data.ptr % 16 == 0
    )


def shared_bytes(kind: str, dk: int, dv: int) -> int:
    """Dynamic shared memory of one block of ``gdn_chunk_<kind><dk>`` (tile strides as in
    ``GdnChunk``)."""
    kp, cp, tp = dk + 4, CHUNK + 4, CHUNK + 8
    if kind == "prepare":
        return 4 * (2 * CHUNK + CHUNK * cp + max(2 * dk * tp, CHUNK * (dv + dk + 1)))
    if kind == "states":
        sp, skp = STATE_COLUMNS + 8, dk + 8
        return 4 * (CHUNK * kp + CHUNK * skp + dk * sp + 2 * CHUNK * sp + 2 * CHUNK)
    if kind == "output":
        op = OUTPUT_COLUMNS + 8
        return 4 * (CHUNK * kp + dk * op + CHUNK * cp + CHUNK * op)
    raise ValueError(f"kind {kind!r}: expected prepare, states or output")


def _aligned(a: Any) -> Any:
    import cupy as cp

    a = cp.ascontiguousarray(a, dtype=cp.float32)
    if a.data.ptr % 16:
        a = a.copy()
    return a


def gdn_chunk(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any) -> Any:
    """q, k [T, Hk, dk], v [T, Hv, dv], g, beta [T, Hv], state [Hv, dk, dv] (updated in place)
    -> out [T, Hv, dv] float32 (as the reference's ``chunk``)."""
    import cupy as cp

    if not supported(q, k, v, state):
        raise ValueError(
            f"gdn_chunk: q {q.shape}, k {k.shape}, v {v.shape}, state {state.shape}: expected "
            f"float32 with a key head size in {KEY_DIMS}, a value head size that is a multiple "
            "of 4 and a C-contiguous, 16-byte aligned state"
        )
    t, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    if g.shape != (t, hv) or beta.shape != (t, hv):
        raise ValueError(f"gdn_chunk: g {g.shape}, beta {beta.shape}, expected ({t}, {hv})")
    out = cp.empty((t, hv, dv), dtype=cp.float32)
    if t == 0:
        return out
    q, k, v, g, beta = (_aligned(a) for a in (q, k, v, g, beta))
    n = -(-t // CHUNK)
    u = cp.empty((n, hv, CHUNK, dv), dtype=cp.float32)
    w = cp.empty((n, hv, CHUNK, dk), dtype=cp.float32)
    qk = cp.empty((n, hv, CHUNK, CHUNK), dtype=cp.float32)
    gam = cp.empty((n, hv, CHUNK), dtype=cp.float32)
    starts = cp.empty((n, hv, dk, dv), dtype=cp.float32)
    vnew = cp.empty((n, hv, CHUNK, dv), dtype=cp.float32)
    dims = (np.int32(t), np.int32(hk), np.int32(hv), np.int32(dv))

    shared = shared_bytes("prepare", dk, dv)
    function(FAMILY, f"gdn_chunk_prepare<{dk}>", shared=shared)(
        (n, hv), (THREADS,), (q, k, v, g, beta, *dims, u, w, qk, gam), shared_mem=shared
    )
    shared = shared_bytes("states", dk, dv)
    function(FAMILY, f"gdn_chunk_states<{dk}>", shared=shared)(
        (-(-dv // STATE_COLUMNS), hv),
        (THREADS,),
        (k, u, w, gam, *dims, state, starts, vnew),
        shared_mem=shared,
    )
    shared = shared_bytes("output", dk, dv)
    function(FAMILY, f"gdn_chunk_output<{dk}>", shared=shared)(
        (n, hv, -(-dv // OUTPUT_COLUMNS)),
        (THREADS,),
        (q, qk, gam, starts, vnew, *dims, out),
        shared_mem=shared,
    )
    return out
