"""Launchers for decode attention over a paged KV pool and the KV-cache write
(``kernels/attention.cu``), matching ``array_ops.attention_decode`` and ``array_ops.kv_write``.

Pools are ``[pages, PAGE, Nkv, D]`` float32, uint16 holding bfloat16 words, or uint8 holding
unscaled E4M3FN bytes (``state.KV_DTYPES``). Launches never read device memory or synchronise:
the split count depends only on the table's reach (``max_pages * PAGE``), so a launch can be
captured in a CUDA graph and replayed with other positions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .compile import function, register_family

FAMILY = "attention"
HEAD_DIMS = (32, 64, 128, 256)
MAX_GROUP = 8
#: must match ATTN_WARPS in kernels/attention.cu
ATTN_WARPS = 4
#: must match MAX_SPLITS in kernels/attention.cu (the combine's shared weights)
MAX_SPLITS = 256
#: blocks one decode-attention launch aims for (pairs x splits): BLOCKS_PER_PAIR a (lane, kv
#: head) pair, at least MIN_BLOCKS and at most TARGET_BLOCKS. On the H200 at 16k tokens, 4 kv
#: heads (benchmarks/attention_bench.py): 8 lanes ran 15-20% faster in 512-token splits (1,024
#: blocks) than in 64- (8,192) or 1,024-token ones (512), 4 lanes fastest at 1,024 blocks too,
#: and one lane 18-23% faster in 256-token splits (256 blocks) than in 64-token ones (1,024)
TARGET_BLOCKS = 1024
MIN_BLOCKS = 256
BLOCKS_PER_PAIR = 64
_DTYPES = {np.dtype(np.float32): "float", np.dtype(np.uint16): "u16", np.dtype(np.uint8): "u8"}

register_family(
    FAMILY,
    [
        f"attn_partial<{d}, {g}, {t}>"
        for d in HEAD_DIMS
        for g in range(1, MAX_GROUP + 1)
        for t in _DTYPES.values()
    ]
    + [f"attn_combine<{d}>" for d in HEAD_DIMS]
    + [f"kv_write<{t}>" for t in _DTYPES.values()],
)

__all__ = ["attention_decode", "kv_write", "split_policy"]


def split_policy(max_context: int, pairs: int = 1) -> tuple[int, int]:
    """(chunk, splits) for a table reaching ``max_context`` tokens, with ``pairs`` (lane,
    kv head) pairs to run: chunks of at least 64 tokens (a multiple of 64), cut so that pairs
    x splits come to about ``BLOCKS_PER_PAIR`` blocks a pair, within ``MIN_BLOCKS`` ..
    ``TARGET_BLOCKS`` (at most ``MAX_SPLITS`` splits). A few pairs need several splits each
    to fill the GPU, but not so many that each split reads a short run; many lanes fill it
    anyway, and then longer splits read K/V in longer runs and write fewer partials."""
    blocks = min(TARGET_BLOCKS, max(MIN_BLOCKS, BLOCKS_PER_PAIR * pairs))
    want = max(1, min(MAX_SPLITS, -(-blocks // pairs)))
    per_split = -(-max_context // want)
    chunk = max(64, -(-per_split // 64) * 64)
    return chunk, -(-max_context // chunk)


def check_array(name: str, a: Any, dtypes: tuple[Any, ...], ndim: int) -> None:
    """ValueError naming ``name`` unless ``a`` is a C-contiguous ``ndim``-d device array of
    one of ``dtypes``."""
    if getattr(a, "ndim", None) != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d device array, got {getattr(a, 'shape', a)}")
    if a.dtype not in [np.dtype(t) for t in dtypes]:
        raise ValueError(f"{name}: dtype {a.dtype}, expected one of {[str(t) for t in dtypes]}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: must be C-contiguous")


def _check_paged(
    k_pages: Any, v_pages: Any, page_table: Any, slots: Any, positions: Any
) -> tuple[int, int, int, int]:
    """Validate the pool, table and per-lane arrays -> (N, PAGE, Nkv, D)."""
    check_array("k_pages", k_pages, tuple(_DTYPES), 4)
    check_array("v_pages", v_pages, tuple(_DTYPES), 4)
    if v_pages.shape != k_pages.shape or v_pages.dtype != k_pages.dtype:
        raise ValueError(
            f"v_pages: {v_pages.shape} {v_pages.dtype} differs from k_pages "
            f"{k_pages.shape} {k_pages.dtype}"
        )
    _, page, nkv, d = k_pages.shape
    if d not in HEAD_DIMS:
        raise ValueError(f"k_pages: head dim {d} not supported (one of {HEAD_DIMS})")
    for name, pool in (("k_pages", k_pages), ("v_pages", v_pages)):
        if pool.data.ptr % 16:
            raise ValueError(f"{name}: must be 16-byte aligned (rows are read as vectors)")
    check_array("page_table", page_table, (np.int32,), 2)
    check_array("slots", slots, (np.int32,), 1)
    check_array("positions", positions, (np.int32,), 1)
    n = slots.shape[0]
    if positions.shape != (n,):
        raise ValueError(f"positions: shape {positions.shape}, expected ({n},) like slots")
    if page_table.shape[1] * page >= 2**31:
        raise ValueError("page_table: max_pages * PAGE must fit in int32")
    return n, page, nkv, d


def group_parts(group: int) -> int:
    """The fewest equal shares of ``group`` query heads a kv head with at most ``MAX_GROUP``
    heads each: the launches ``attention_decode`` makes for it."""
    return next(p for p in range(1, group + 1) if group % p == 0 and group // p <= MAX_GROUP)


def attention_decode(
    q: Any,
    k_pages: Any,
    v_pages: Any,
    page_table: Any,
    slots: Any,
    positions: Any,
    scale: float,
    chunk: int | None = None,
) -> Any:
    """q [N, Nq, D] float32: row i attends over tokens 0..positions[i] of slot ``slots[i]``
    (query head j reads kv head ``j // (Nq / Nkv)``) -> float32 [N, Nq, D], a new array.
    ``chunk`` (tokens per split, a multiple of 64) overrides ``split_policy``. A group of
    more than ``MAX_GROUP`` query heads a kv head (the kernel keeps a group's queries and
    accumulators in registers and shared memory) is served in equal shares of at most that
    many, one launch each: Qwen4Exp's 12 as two of 6."""
    import cupy as cp

    n, page, nkv, d = _check_paged(k_pages, v_pages, page_table, slots, positions)
    check_array("q", q, (np.float32,), 3)
    if q.shape[0] != n or q.shape[2] != d:
        raise ValueError(f"q: shape {q.shape}, expected ({n}, Nq, {d})")
    nq = q.shape[1]
    if nq % nkv or nq < nkv:
        raise ValueError(f"q: {nq} heads over {nkv} kv heads: need a whole group of each")
    group = nq // nkv
    parts = group_parts(group)
    if parts > 1:  # query head h·group + g: share i takes every kv head's g of [i·s, (i+1)·s)
        share = group // parts
        by_share = q.reshape(n, nkv, parts, share, d)
        rest = (k_pages, v_pages, page_table, slots, positions, scale, chunk)
        outs = [
            attention_decode(
                cp.ascontiguousarray(by_share[:, :, i]).reshape(n, nkv * share, d), *rest
            ).reshape(n, nkv, share, d)
            for i in range(parts)
        ]
        return cp.stack(outs, axis=2).reshape(n, nq, d)
    out = cp.empty((n, nq, d), dtype=cp.float32)
    if n == 0:
        return out
    max_context = page_table.shape[1] * page
    if chunk is None:
        chunk = split_policy(max_context, n * nkv)[0]
    splits = -(-max_context // chunk) if chunk > 0 else 0
    if chunk % 64 or not 0 < splits <= MAX_SPLITS:
        raise ValueError(f"chunk {chunk}: a multiple of 64 with at most {MAX_SPLITS} splits")
    ws_acc = cp.empty((n, nkv, splits, group, d), dtype=cp.float32)
    ws_ml = cp.empty((n, nkv, splits, group, 2), dtype=cp.float32)
    kind = _DTYPES[k_pages.dtype]
    function(FAMILY, f"attn_partial<{d}, {group}, {kind}>")(
        (n, nkv, splits),
        (ATTN_WARPS * 32,),
        (
            q,
            k_pages,
            v_pages,
            page_table,
            slots,
            positions,
            np.int32(nkv),
            np.int32(page),
            np.int32(page_table.shape[1]),
            np.int32(chunk),
            np.float32(scale),
            ws_acc,
            ws_ml,
        ),
    )
    function(FAMILY, f"attn_combine<{d}>")(
        (n, nq),
        (d,),
        (
            ws_acc,
            ws_ml,
            positions,
            np.int32(nkv),
            np.int32(group),
            np.int32(splits),
            np.int32(chunk),
            np.int32(max_context),
            out,
        ),
    )
    return out


def kv_write(
    k_pages: Any, v_pages: Any, page_table: Any, slots: Any, positions: Any, k: Any, v: Any
) -> None:
    """Store k, v [N, Nkv, D] float32 at each row's position: page
    ``page_table[slot, pos // PAGE]``, row ``pos % PAGE`` (bf16 and E4M3 pools round to nearest
    even, E4M3 saturating at +-448: ``state.store_kv``, bit for bit).
    Positions outside ``0 .. max_pages * PAGE - 1`` write nothing."""
    n, page, nkv, d = _check_paged(k_pages, v_pages, page_table, slots, positions)
    for name, a in (("k", k), ("v", v)):
        check_array(name, a, (np.float32,), 3)
        if a.shape != (n, nkv, d):
            raise ValueError(f"{name}: shape {a.shape}, expected ({n}, {nkv}, {d})")
    total = n * nkv * d
    if total == 0:
        return
    threads = 256
    function(FAMILY, f"kv_write<{_DTYPES[k_pages.dtype]}>")(
        (min(-(-total // threads), 4096),),
        (threads,),
        (
            k_pages,
            v_pages,
            page_table,
            slots,
            positions,
            k,
            v,
            np.int32(n),
            np.int32(nkv * d),
            np.int32(page),
            np.int32(page_table.shape[1]),
        ),
    )
