"""Launchers of the Gated DeltaNet prefill (``kernels/gdn_prefill.cu``), one lane's T tokens
as the delta_rule reference's ``prefill``, or several lanes' rows stacked (``Segment``s, each
with its own slot of the state arrays) in the same launches: ``conv_heads`` (the convolution,
SiLU and the q/k normalisation, one launch) and ``gdn_chunk`` (the delta rule in the chunked
form, in three launches: what each chunk needs without the state, for all chunks at once;
each segment's state through its chunks in order; the outputs, all chunks at once). Launches
only: no synchronisation and no device reads; the segments' tables are copied to the device
once and kept while the same segments come again (every recurrent layer of a forward).
"""

from __future__ import annotations

import functools
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

__all__ = ["Segment", "conv_heads", "gdn_chunk", "gdn_chunk_rows", "shared_bytes", "supported"]

#: one lane's rows in a stacked batch: (first row, rows, slot of the state arrays)
Segment = tuple[int, int, int]
#: segment tables kept on the device (the most recent forwards' layouts)
TABLES_KEPT = 16


@functools.lru_cache(maxsize=TABLES_KEPT)
def _table(place: tuple[int, int], kind: str, segments: tuple[Segment, ...]) -> Any:
    """The device table of ``kind`` for ``segments`` (int32; ``place``: the current device
    and stream, part of the key, so a table is only read in the stream order of its copy):
    ``tiles`` [n, 4] (a convolution block's first row, rows, its segment's first row, slot),
    ``chunks`` [n, 2] (a chunk's first row and rows), ``segments`` [s, 4] (a segment's
    first chunk, end chunk, slot, 0)."""
    import cupy as cp

    rows = []
    if kind == "tiles":
        for first, count, slot in segments:
            for at in range(0, count, CONV_TOKENS):
                rows.append((first + at, min(CONV_TOKENS, count - at), first, slot))
    elif kind == "chunks":
        for first, count, _ in segments:
            for at in range(0, count, CHUNK):
                rows.append((first + at, min(CHUNK, count - at)))
    else:
        chunk = 0
        for _, count, slot in segments:
            end = chunk + -(-count // CHUNK)
            rows.append((chunk, end, slot, 0))
            chunk = end
    return cp.asarray(np.array(rows, dtype=np.int32))


def _place() -> tuple[int, int]:
    """The current device and stream."""
    import cupy as cp

    return cp.cuda.Device().id, cp.cuda.get_current_stream().ptr


def conv_heads(
    mixed: Any,
    kernel: Any,
    conv_states: Any,
    segments: tuple[Segment, ...],
    *,
    key_heads: int,
    key_dim: int,
    value_width: int,
) -> tuple[Any, Any, Any]:
    """The segments' rows of mixed [N, >= C] (the [q | k | v] channels first; rows may be a
    wider array's), each segment continuing the causal convolution of its slot of
    conv_states [slots, C, K-1] (updated), through it, SiLU, and the split into heads -> q,
    k [N, Hk, dk] (l2-normalised, q scaled by dk^-1/2) and v [N, C - 2 Hk dk] float32 (rows
    of no segment left unwritten). A block per 8 tokens of a segment and slice of channels
    (whole key heads), four channels a thread in float4 where every row and pointer is
    16-byte aligned, else one."""
    import cupy as cp

    taps, channels = kernel.shape
    t = mixed.shape[0]
    if (
        taps not in CONV_TAPS
        or conv_states.shape[1:] != (channels, taps - 1)
        or conv_states.dtype != np.float32
        or not conv_states.flags.c_contiguous
    ):
        raise ValueError(
            f"conv_heads: kernel {kernel.shape}, conv_states {conv_states.dtype} "
            f"{conv_states.shape}: expected [K, C] with K in {CONV_TAPS} and C-contiguous "
            "float32 [slots, C, K-1] states"
        )
    if channels != 2 * key_heads * key_dim + value_width or mixed.shape[1] < channels:
        raise ValueError(f"conv_heads: mixed {mixed.shape} has not the {channels} channels")
    if mixed.dtype != np.float32 or mixed.strides[1] != 4:
        mixed = cp.ascontiguousarray(mixed, dtype=cp.float32)
    kernel = cp.ascontiguousarray(kernel, dtype=cp.float32)
    q = cp.empty((t, key_heads, key_dim), dtype=cp.float32)
    k = cp.empty((t, key_heads, key_dim), dtype=cp.float32)
    v = cp.empty((t, value_width), dtype=cp.float32)
    segments = tuple(seg for seg in segments if seg[1])
    if not segments:
        return q, k, v
    tiles = _table(_place(), "tiles", segments)
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
        (tiles.shape[0], -(-channels // slice_)),
        (CONV_THREADS,),
        (
            mixed,
            np.int64(row_stride),
            kernel,
            conv_states,
            tiles,
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
    # after the launch (stream order): each state becomes its window's last K-1 inputs, all
    # of them the segment's rows when it has that many (one copy)
    keep = taps - 1
    for first, count, slot in segments:
        state, end = conv_states[slot], first + count
        if count >= keep:
            state[...] = mixed[end - keep : end, :channels].T
        else:
            window = cp.concatenate([state.T, mixed[first:end, :channels]])
            state[...] = window[-keep:].T
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
    -> out [T, Hv, dv] float32 (as the reference's ``chunk``): one lane, ``gdn_chunk_rows``
    with one segment."""
    if not supported(q, k, v, state):
        raise ValueError(
            f"gdn_chunk: q {q.shape}, k {k.shape}, v {v.shape}, state {state.shape}: expected "
            f"float32 with a key head size in {KEY_DIMS}, a value head size that is a multiple "
            "of 4 and a C-contiguous, 16-byte aligned state"
        )
    return gdn_chunk_rows(q, k, v, g, beta, state[None], ((0, q.shape[0], 0),))


def gdn_chunk_rows(
    q: Any, k: Any, v: Any, g: Any, beta: Any, states: Any, segments: tuple[Segment, ...]
) -> Any:
    """The delta rule over each segment's rows of q, k [N, Hk, dk], v [N, Hv, dv], g, beta
    [N, Hv], from its slot of states [slots, Hv, dk, dv] (updated in place) -> out [N, Hv, dv]
    float32 (rows of no segment left unwritten): one set of launches for every segment."""
    import cupy as cp

    if not supported(q, k, v, states[0]) or states.ndim != 4:
        raise ValueError(
            f"gdn_chunk_rows: q {q.shape}, k {k.shape}, v {v.shape}, states {states.shape}: "
            f"expected float32 with a key head size in {KEY_DIMS}, a value head size that is "
            "a multiple of 4 and C-contiguous, 16-byte aligned [slots, Hv, dk, dv] states"
        )
    t, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    if g.shape != (t, hv) or beta.shape != (t, hv):
        raise ValueError(f"gdn_chunk_rows: g {g.shape}, beta {beta.shape}, expected ({t}, {hv})")
    out = cp.empty((t, hv, dv), dtype=cp.float32)
    segments = tuple(seg for seg in segments if seg[1])
    if not segments:
        return out
    chunks = _table(_place(), "chunks", segments)
    per_segment = _table(_place(), "segments", segments)
    q, k, v, g, beta = (_aligned(a) for a in (q, k, v, g, beta))
    n = chunks.shape[0]
    u = cp.empty((n, hv, CHUNK, dv), dtype=cp.float32)
    w = cp.empty((n, hv, CHUNK, dk), dtype=cp.float32)
    qk = cp.empty((n, hv, CHUNK, CHUNK), dtype=cp.float32)
    gam = cp.empty((n, hv, CHUNK), dtype=cp.float32)
    starts = cp.empty((n, hv, dk, dv), dtype=cp.float32)
    vnew = cp.empty((n, hv, CHUNK, dv), dtype=cp.float32)
    heads = (np.int32(hk), np.int32(hv), np.int32(dv))

    shared = shared_bytes("prepare", dk, dv)
    function(FAMILY, f"gdn_chunk_prepare<{dk}>", shared=shared)(
        (n, hv), (THREADS,), (q, k, v, g, beta, chunks, *heads, u, w, qk, gam), shared_mem=shared
    )
    shared = shared_bytes("states", dk, dv)
    function(FAMILY, f"gdn_chunk_states<{dk}>", shared=shared)(
        (-(-dv // STATE_COLUMNS), hv, len(segments)),
        (THREADS,),
        (k, u, w, gam, chunks, per_segment, *heads, states, starts, vnew),
        shared_mem=shared,
    )
    shared = shared_bytes("output", dk, dv)
    function(FAMILY, f"gdn_chunk_output<{dk}>", shared=shared)(
        (n, hv, -(-dv // OUTPUT_COLUMNS)),
        (THREADS,),
        (q, qk, gam, starts, vnew, chunks, *heads, out),
        shared_mem=shared,
    )
    return out
