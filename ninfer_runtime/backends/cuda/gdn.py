"""Launchers for the Gated DeltaNet kernels (``kernels/gdn.cu``), conv and recurrent states in
pools indexed by slot: the decode step (N lanes, one token each: ``conv_step``, ``gdn_step``)
and speculative verification (``gdn_verify``: T tokens per lane from the states, which stay
as they are, each row's inputs recorded; ``gdn_commit``: the first ``counts[i]`` recorded
tokens of lane i folded into its states, ``counts`` read on the device). A verified or
committed token runs the decode step's own device code, so it ends bit-identical to decoding
it.

Launches only (outputs from ``cupy.empty``, no synchronisation, no device reads), so all can
be captured in CUDA graphs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .compile import function, register_family

#: conv taps compiled (Qwen3.5 uses 4)
CONV_TAPS = (2, 3, 4)
#: key head sizes compiled; the value head size is a runtime argument
KEY_DIMS = (16, 32, 64, 128)
#: state columns per gdn_step block (GDN_COLS in kernels/gdn.cu); the block has
#: max(dk / 32, 1) warps, which split the dk rows
GDN_COLS = 32
CONV_THREADS = 128

register_family(
    "gdn",
    [f"{name}<{k}>" for name in ("conv_step", "conv_verify", "conv_commit") for k in CONV_TAPS]
    + [
        f"{name}<{d}>"
        for name in ("gdn_step", "kda_step", "gdn_verify", "gdn_commit")
        for d in KEY_DIMS
    ],
)

__all__ = ["conv_step", "gdn_commit", "gdn_step", "gdn_verify", "kda_step", "supported"]


def supported(kernel: Any, key_dim: int) -> bool:
    """Whether kernels are compiled for this conv kernel [K, C] and key head size."""
    return kernel.shape[0] in CONV_TAPS and key_dim in KEY_DIMS


def _check(name: str, a: Any, dtype: type, shape: tuple[int | None, ...]) -> None:
    """ValueError unless ``a`` is a C-contiguous ``dtype`` array of ``shape`` (None: any)."""
    ok = (
        a.dtype == dtype
        and a.ndim == len(shape)
        and all(want is None or want == got for want, got in zip(shape, a.shape, strict=True))
        and a.flags.c_contiguous
    )
    if not ok:
        want = "x".join("?" if s is None else str(s) for s in shape)
        raise ValueError(
            f"{name}: expected a C-contiguous {np.dtype(dtype).name} [{want}] array, "
            f"got {a.dtype} {tuple(a.shape)}"
            + ("" if a.flags.c_contiguous else " (not C-contiguous)")
        )


def conv_step(x: Any, kernel: Any, conv_states: Any, slots: Any, *, silu: bool = True) -> Any:
    """One token of the depthwise causal convolution per lane, then SiLU unless ``silu`` is
    False: x [N, C], kernel [K, C] (tap K-1 multiplies x), conv_states [S, C, K-1] (updated
    in place at ``slots``), slots int32 [N] (distinct) -> y float32 [N, C]."""
    import cupy

    _check("x", x, np.float32, (None, None))
    n, c = x.shape
    taps = _check_conv(kernel, conv_states, c)
    _check("slots", slots, np.int32, (n,))
    y = cupy.empty((n, c), dtype=cupy.float32)
    if n:
        function("gdn", f"conv_step<{taps}>")(
            ((c + CONV_THREADS - 1) // CONV_THREADS, n),
            (CONV_THREADS,),
            (x, kernel, conv_states, slots, np.int32(c), np.int32(bool(silu)), y),
        )
    return y


def gdn_step(
    qkv: Any,
    g: Any,
    beta: Any,
    states: Any,
    slots: Any,
    *,
    key_heads: int,
    key_dim: int,
    value_heads: int,
    value_dim: int,
) -> Any:
    """One gated-delta-rule step per lane: qkv [N, 2*Hk*dk + Hv*dv] = [q | k | v] (conv
    output; q and k are l2-normalised here, q also scaled by dk**-0.5), g, beta [N, Hv],
    states [S, Hv, dk, dv] (updated in place at ``slots``), slots int32 [N] (distinct)
    -> o float32 [N, Hv, dv]. Value head h reads key head h // (Hv / Hk)."""
    dims = (key_heads, key_dim, value_heads, value_dim)
    return _step("gdn_step", qkv, g, (value_heads,), beta, states, slots, *dims)


def kda_step(
    qkv: Any, g: Any, beta: Any, states: Any, slots: Any, *, heads: int, head_dim: int
) -> Any:
    """``gdn_step`` with one log-decay a key channel (Kimi Delta Attention): g [N, H,
    head_dim]; query, key and value heads alike (H of ``head_dim``) -> o float32 [N, H,
    head_dim]."""
    dims = (heads, head_dim, heads, head_dim)
    return _step("kda_step", qkv, g, (heads, head_dim), beta, states, slots, *dims)


def _step(
    name: str,
    qkv: Any,
    g: Any,
    g_shape: tuple[int, ...],
    beta: Any,
    states: Any,
    slots: Any,
    key_heads: int,
    key_dim: int,
    value_heads: int,
    value_dim: int,
) -> Any:
    """One token a lane through kernel ``name`` (``gdn_step``, ``kda_step``), g [N, *g_shape]."""
    import cupy

    _check("qkv", qkv, np.float32, (None, _channels(key_heads, key_dim, value_heads, value_dim)))
    n = qkv.shape[0]
    _check("g", g, np.float32, (n, *g_shape))
    _check("beta", beta, np.float32, (n, value_heads))
    _check("states", states, np.float32, (None, value_heads, key_dim, value_dim))
    _check("slots", slots, np.int32, (n,))
    o = cupy.empty((n, value_heads, value_dim), dtype=cupy.float32)
    if n:
        function("gdn", f"{name}<{key_dim}>")(
            _gdn_grid(value_heads, value_dim, n),
            _gdn_block(key_dim),
            (
                qkv,
                g,
                beta,
                states,
                slots,
                np.int32(key_heads),
                np.int32(value_heads),
                np.int32(value_dim),
                o,
            ),
        )
    return o


def gdn_verify(
    mixed: Any,
    kernel: Any,
    conv_states: Any,
    g: Any,
    beta: Any,
    states: Any,
    slots: Any,
    records: Any,
    *,
    tokens: int,
    key_heads: int,
    key_dim: int,
    value_heads: int,
    value_dim: int,
) -> Any:
    """``tokens`` consecutive tokens per lane through the decode step's math, from the lanes'
    conv and recurrent states, which are only read: mixed [N = lanes * T, C] projected
    [q | k | v] channels (lane-major rows), g, beta [N, Hv], slots int32 [lanes] (distinct).
    The rows' mixed, g and beta are stored at ``records.mixed/g/beta[slot, :T]``
    (``GdnDrafts``, [S, R >= T, ...]). -> o float32 [N, Hv, dv]. Two launches: the
    convolution of every row (conv_verify), then the delta rule with each lane's state tile
    loaded once and run over its T tokens in order (gdn_verify)."""
    import cupy

    c = _channels(key_heads, key_dim, value_heads, value_dim)
    _check("mixed", mixed, np.float32, (None, c))
    rows = mixed.shape[0]
    if tokens < 1 or rows % tokens:
        raise ValueError(f"mixed: {rows} rows are not lanes of {tokens} tokens")
    lanes = rows // tokens
    taps = _check_conv(kernel, conv_states, c)
    _check("g", g, np.float32, (rows, value_heads))
    _check("beta", beta, np.float32, (rows, value_heads))
    _check("states", states, np.float32, (None, value_heads, key_dim, value_dim))
    _check("slots", slots, np.int32, (lanes,))
    record_rows = _check_records(records, states.shape[0], c, value_heads)
    if tokens > record_rows:
        raise ValueError(f"records: {record_rows} rows per slot, {tokens} tokens to record")
    y = cupy.empty((rows, c), dtype=cupy.float32)
    o = cupy.empty((rows, value_heads, value_dim), dtype=cupy.float32)
    if lanes:
        function("gdn", f"conv_verify<{taps}>")(
            ((c + CONV_THREADS - 1) // CONV_THREADS, lanes),
            (CONV_THREADS,),
            (
                mixed,
                kernel,
                conv_states,
                slots,
                np.int32(c),
                np.int32(tokens),
                y,
                records.mixed,
                np.int32(record_rows),
            ),
        )
        function("gdn", f"gdn_verify<{key_dim}>")(
            _gdn_grid(value_heads, value_dim, lanes),
            _gdn_block(key_dim),
            (
                y,
                g,
                beta,
                states,
                slots,
                np.int32(key_heads),
                np.int32(value_heads),
                np.int32(value_dim),
                np.int32(tokens),
                o,
                records.g,
                records.beta,
                np.int32(record_rows),
            ),
        )
    return o


def gdn_commit(
    kernel: Any,
    conv_states: Any,
    states: Any,
    slots: Any,
    records: Any,
    counts: Any,
    *,
    key_heads: int,
    key_dim: int,
    value_heads: int,
    value_dim: int,
) -> None:
    """Fold the first ``counts[i]`` tokens ``gdn_verify`` recorded for lane i (slot
    ``slots[i]``; counts int32 [lanes], read on the device and clamped to 0..R) into its conv
    and recurrent states, in place. Two launches: the recorded rows' convolution, which
    leaves the conv state after them (conv_commit), then the delta rule with each state tile
    loaded once, run over the lane's tokens and stored (gdn_commit)."""
    import cupy

    c = _channels(key_heads, key_dim, value_heads, value_dim)
    taps = _check_conv(kernel, conv_states, c)
    _check("states", states, np.float32, (None, value_heads, key_dim, value_dim))
    _check("slots", slots, np.int32, (None,))
    lanes = slots.shape[0]
    _check("counts", counts, np.int32, (lanes,))
    record_rows = _check_records(records, states.shape[0], c, value_heads)
    if not lanes or not record_rows:
        return
    y = cupy.empty((lanes * record_rows, c), dtype=cupy.float32)
    function("gdn", f"conv_commit<{taps}>")(
        ((c + CONV_THREADS - 1) // CONV_THREADS, lanes),
        (CONV_THREADS,),
        (
            records.mixed,
            np.int32(record_rows),
            kernel,
            conv_states,
            slots,
            counts,
            np.int32(c),
            y,
        ),
    )
    function("gdn", f"gdn_commit<{key_dim}>")(
        _gdn_grid(value_heads, value_dim, lanes),
        _gdn_block(key_dim),
        (
            y,
            records.g,
            records.beta,
            np.int32(record_rows),
            states,
            slots,
            counts,
            np.int32(key_heads),
            np.int32(value_heads),
            np.int32(value_dim),
        ),
    )


def _channels(key_heads: int, key_dim: int, value_heads: int, value_dim: int) -> int:
    """The conv channels ``2 * Hk * dk + Hv * dv`` of valid head sizes (else ValueError)."""
    if key_dim not in KEY_DIMS:
        raise ValueError(f"key_dim: {key_dim}, compiled for {KEY_DIMS}")
    if key_heads <= 0 or value_heads % key_heads:
        raise ValueError(f"value_heads: {value_heads} is not a multiple of key_heads {key_heads}")
    if value_dim <= 0:
        raise ValueError(f"value_dim: {value_dim}")
    return 2 * key_heads * key_dim + value_heads * value_dim


def _check_conv(kernel: Any, conv_states: Any, channels: int) -> int:
    """The conv kernel's tap count, after checking it and the conv states."""
    _check("kernel", kernel, np.float32, (None, channels))
    taps = kernel.shape[0]
    if taps not in CONV_TAPS:
        raise ValueError(f"kernel: {taps} taps, compiled for {CONV_TAPS}")
    _check("conv_states", conv_states, np.float32, (None, channels, taps - 1))
    return taps


def _check_records(records: Any, slots: int, channels: int, value_heads: int) -> int:
    """The rows per slot of a ``GdnDrafts``, after checking its three arrays."""
    _check("records.mixed", records.mixed, np.float32, (slots, None, channels))
    rows = records.mixed.shape[1]
    _check("records.g", records.g, np.float32, (slots, rows, value_heads))
    _check("records.beta", records.beta, np.float32, (slots, rows, value_heads))
    return rows


def _gdn_grid(value_heads: int, value_dim: int, lanes: int) -> tuple[int, int, int]:
    """One block per (32-column tile, value head, lane)."""
    return ((value_dim + GDN_COLS - 1) // GDN_COLS, value_heads, lanes)


def _gdn_block(key_dim: int) -> tuple[int]:
    return (max(key_dim, 32),)
