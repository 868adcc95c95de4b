"""Launchers for the Gated DeltaNet decode step (``kernels/gdn.cu``): N lanes, one token each,
conv and recurrent states in pools indexed by slot.

Launches only (outputs from ``cupy.empty``, no synchronisation, no device reads), so both can
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
    "gdn", [f"conv_step<{k}>" for k in CONV_TAPS] + [f"gdn_step<{d}>" for d in KEY_DIMS]
)

__all__ = ["conv_step", "gdn_step"]


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
    _check("kernel", kernel, np.float32, (None, c))
    taps = kernel.shape[0]
    if taps not in CONV_TAPS:
        raise ValueError(f"kernel: {taps} taps, compiled for {CONV_TAPS}")
    _check("conv_states", conv_states, np.float32, (None, c, taps - 1))
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
    import cupy

    if key_dim not in KEY_DIMS:
        raise ValueError(f"key_dim: {key_dim}, compiled for {KEY_DIMS}")
    if key_heads <= 0 or value_heads % key_heads:
        raise ValueError(f"value_heads: {value_heads} is not a multiple of key_heads {key_heads}")
    if value_dim <= 0:
        raise ValueError(f"value_dim: {value_dim}")
    _check("qkv", qkv, np.float32, (None, 2 * key_heads * key_dim + value_heads * value_dim))
    n = qkv.shape[0]
    _check("g", g, np.float32, (n, value_heads))
    _check("beta", beta, np.float32, (n, value_heads))
    _check("states", states, np.float32, (None, value_heads, key_dim, value_dim))
    _check("slots", slots, np.int32, (n,))
    o = cupy.empty((n, value_heads, value_dim), dtype=cupy.float32)
    if n:
        function("gdn", f"gdn_step<{key_dim}>")(
            ((value_dim + GDN_COLS - 1) // GDN_COLS, value_heads, n),
            (max(key_dim, 32),),
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
