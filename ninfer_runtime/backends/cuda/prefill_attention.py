"""Launcher for the flash-style causal prefill attention (``kernels/prefill_attention.cu``),
matching ``array_ops.attention``: one lane's queries over its contiguous K/V cache, with no
[T, S] score matrix in memory.

Precisions (the kernel's ``PREC``): ``"tf32"`` runs both products on TF32 tensor cores;
``"split_qk"`` computes the scores in 3xTF32 (about float32) and P·V in TF32, which keeps the
result within about 3e-4 of float32 even for peaked attention (plain TF32 scores reach 1e-2
there); ``"split"`` does both in 3xTF32 (about 1e-6).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .compile import function, register_family, sm_count

FAMILY = "prefill_attention"
HEAD_DIMS = (64, 128, 256)
PRECISIONS = {"tf32": 0, "split_qk": 1, "split": 2}
#: must match PF_WARPS / PF_ROWS in the kernel: query rows (token, head) per block
WARPS = 4
ROWS = WARPS * 16
#: most key-range splits of a launch, and the fewest key tiles a split should hold
MAX_SPLITS = 64
MIN_SPLIT_TILES = 8
LOG2E = 1.4426950408889634

register_family(
    FAMILY,
    [f"prefill_attention<{d}, {p}>" for d in HEAD_DIMS for p in PRECISIONS.values()]
    + [f"prefill_combine<{d}>" for d in HEAD_DIMS],
)

__all__ = [
    "kernel_input",
    "prefill_attention",
    "smem_bytes",
    "split_count",
    "supported",
    "tile_keys",
]


def tile_keys(d: int) -> int:
    """Keys per K/V tile (``PfTile<D>::BN``)."""
    return 64 if d <= 64 else 32


def smem_bytes(d: int) -> int:
    """Dynamic shared memory of ``prefill_attention<d, *>``: the Q rows and two K and V tiles
    (row strides as in ``PfTile``)."""
    bn = tile_keys(d)
    return 4 * (ROWS * (d + 16) + 2 * bn * (d + 16) + 2 * bn * (d + 4))


def supported(q: Any, k_cache: Any, v_cache: Any) -> bool:
    """Whether ``prefill_attention`` takes these arrays (else use the reference)."""
    return (
        getattr(q, "ndim", None) == 3
        and getattr(k_cache, "ndim", None) == 3
        and q.shape[2] in HEAD_DIMS
        and q.dtype == k_cache.dtype == v_cache.dtype == np.float32
        and k_cache.shape == v_cache.shape
        and k_cache.shape[2] == q.shape[2]
        and k_cache.shape[1] > 0
        and q.shape[1] % k_cache.shape[1] == 0
    )


def kernel_input(a: Any) -> Any:
    """``a`` C-contiguous and 16-byte aligned (copied only when it is not)."""
    import cupy as cp

    a = cp.ascontiguousarray(a)
    return a if a.data.ptr % 16 == 0 else a.copy()


def split_count(blocks: int, max_tiles: int, sms: int, per_sm: int) -> int:
    """Key-range splits for a launch of ``blocks`` row blocks: enough blocks to fill the
    device twice when the rows alone do not, each split keeping MIN_SPLIT_TILES tiles."""
    target = 2 * sms * per_sm
    if blocks >= target:
        return 1
    want = -(-target // blocks)
    return max(1, min(want, max_tiles // MIN_SPLIT_TILES, MAX_SPLITS))


def _check(name: str, a: Any, ndim: int) -> None:
    if getattr(a, "ndim", None) != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d device array, got {getattr(a, 'shape', a)}")
    if a.dtype != np.float32:
        raise ValueError(f"{name}: dtype {a.dtype}, expected float32")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: must be C-contiguous")
    if a.data.ptr % 16:
        raise ValueError(f"{name}: must be 16-byte aligned (rows are read as vectors)")


def prefill_attention(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    *,
    start: int,
    scale: float,
    precision: str = "split_qk",
    splits: int | None = None,
) -> Any:
    """q [T, Nq, D] at positions ``start .. start+T-1`` over k_cache, v_cache [S, Nkv, D]
    (S >= start+T, rows through start+T-1 written), all float32 device arrays, C-contiguous
    and 16-byte aligned -> float32 [T, Nq, D], a new array. ``splits`` overrides the
    key-range split count (tests)."""
    import cupy as cp

    _check("q", q, 3)
    _check("k_cache", k_cache, 3)
    _check("v_cache", v_cache, 3)
    t, nq, d = q.shape
    s, nkv, dk = k_cache.shape
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: shape {v_cache.shape} differs from k_cache {k_cache.shape}")
    if d not in HEAD_DIMS:
        raise ValueError(f"q: head dim {d} not supported (one of {HEAD_DIMS})")
    if dk != d:
        raise ValueError(f"k_cache: head dim {dk}, expected {d} like q")
    if nkv == 0 or nq % nkv:
        raise ValueError(f"q: {nq} heads are not a multiple of the {nkv} kv heads")
    if precision not in PRECISIONS:
        raise ValueError(f"precision: {precision!r}, expected one of {sorted(PRECISIONS)}")
    start = int(start)
    if start < 0 or start + t > s:
        raise ValueError(f"start: {start} + {t} queries exceeds the cache's {s} rows")
    out = cp.empty((t, nq, d), dtype=cp.float32)
    if t == 0 or nq == 0:
        return out
    group = nq // nkv
    mblocks = -(-(t * group) // ROWS)
    if mblocks > 65535:
        raise ValueError(f"q: {t} tokens x {group} heads per kv head is too many rows")
    bn = tile_keys(d)
    max_tiles = -(-(start + t) // bn)
    if splits is None:
        per_sm = max(1, (227 << 10) // smem_bytes(d))
        splits = split_count(mblocks * nkv, max_tiles, sm_count(), per_sm)
    splits = max(1, min(int(splits), max_tiles))
    per_split = -(-max_tiles // splits)
    splits = -(-max_tiles // per_split)  # no split that is empty for every block
    shared = smem_bytes(d)
    kernel = function(FAMILY, f"prefill_attention<{d}, {PRECISIONS[precision]}>", shared=shared)
    if splits > 1:
        ws_o = cp.empty((splits, t * nq, d), dtype=cp.float32)
        ws_ml = cp.empty((splits, t * nq, 2), dtype=cp.float32)
    else:
        ws_o = ws_ml = out  # not touched
    kernel(
        (nkv, mblocks, splits),
        (WARPS * 32,),
        (
            q,
            k_cache,
            v_cache,
            out,
            ws_o,
            ws_ml,
            np.int32(t),
            np.int32(nq),
            np.int32(nkv),
            np.int32(start),
            np.int32(per_split),
            np.float32(scale * LOG2E),
        ),
        shared_mem=shared,
    )
    if splits > 1:
        function(FAMILY, f"prefill_combine<{d}>")(
            (t * nq,), (d // 4,), (ws_o, ws_ml, out, np.int32(t * nq), np.int32(splits))
        )
    return out
