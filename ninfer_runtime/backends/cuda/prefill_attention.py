"""Launcher for the flash-style causal prefill attention (``kernels/prefill_attention.cu``),
matching ``array_ops.attention_pages``: one lane's queries over its keys/values where the
context pool keeps them, with no [T, S] score matrix and no gathered copy of the context.

The kernel reads each K/V tile through the lane's page ids (token t: row ``t % PAGE`` of page
``pages[t // PAGE]``) straight from the layer's pools ``[num_pages, PAGE, Nkv, D]`` in their
storage dtype (float32, bfloat16 words, E4M3 bytes: ``state.KV_DTYPES``), decoding to float32
as a tile lands in shared memory; a prefill chunk over a long context moves each stored byte
once per row block, never a float32 copy of the whole context per layer.

Precisions (the kernel's ``PREC``): ``"bf16"`` computes the scores in 3xBF16 (about 16
mantissa bits) and P·V on bf16 operands, half the tensor-core instructions of ``"split_qk"``,
which computes the scores in 3xTF32 (about float32) and P·V in TF32 (within about 3e-4 of
float32 even for peaked attention; plain TF32 or bf16 scores reach 1e-2 there); ``"split"``
does both in 3xTF32 (about 1e-6). The backend picks them by its prefill precision: bf16,
tf32 and float32 in that order.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .attention import check_array
from .compile import function, register_family, sm_count

FAMILY = "prefill_attention"
HEAD_DIMS = (64, 128, 256)
PRECISIONS = {"bf16": 3, "split_qk": 1, "split": 2}
#: pool storage dtype -> the kernel's KV type (as ``attention.py``)
STORAGE = {np.dtype(np.float32): "float", np.dtype(np.uint16): "u16", np.dtype(np.uint8): "u8"}
#: must match PF_ROW_WARPS / PF_HALVES / PF_ROWS in the kernel: query rows (token, head) per
#: block, 16 a warp, each warp with a partner that takes the other half of every key tile
ROW_WARPS = 4
HALVES = 2
THREADS = ROW_WARPS * HALVES * 32
ROWS = ROW_WARPS * 16
#: most key-range splits of a launch, and the fewest key tiles a split should hold
MAX_SPLITS = 64
MIN_SPLIT_TILES = 8
#: shared memory one block may take on the H200 (sm_90: 227 KiB)
MAX_SHARED = 227 << 10
LOG2E = 1.4426950408889634

register_family(
    FAMILY,
    [
        f"prefill_attention<{d}, {p}, {t}>"
        for d in HEAD_DIMS
        for p in PRECISIONS.values()
        for t in STORAGE.values()
    ]
    + [f"prefill_combine<{d}>" for d in HEAD_DIMS],
)

__all__ = [
    "Launch",
    "launch_shape",
    "prefill_attention",
    "smem_bytes",
    "split_count",
    "supported",
    "tile_keys",
]


def tile_keys(d: int) -> int:
    """Keys per K/V tile (``PfTile<D>::BN``)."""
    return 64 if d <= 64 else 32


def smem_bytes(d: int, itemsize: int = 4) -> int:
    """Dynamic shared memory of ``prefill_attention<d, *, KV>`` for ``itemsize``-byte storage:
    the Q rows and two float K and V tiles (row strides as in ``PfTile``); narrower storage
    keeps one float tile each and stages two raw tiles of each."""
    bn = tile_keys(d)
    q, k, v = ROWS * (d + 16), bn * (d + 16), bn * (d + 4)
    if itemsize == 4:
        return 4 * (q + 2 * k + 2 * v)
    return 4 * (q + k + v) + 2 * 2 * bn * d * itemsize


def supported(q: Any, k_pages: Any, v_pages: Any) -> bool:
    """Whether ``prefill_attention`` takes these arrays (else use the reference)."""
    return (
        getattr(q, "ndim", None) == 3
        and getattr(k_pages, "ndim", None) == 4
        and q.shape[2] in HEAD_DIMS
        and q.dtype == np.float32
        and k_pages.dtype in STORAGE
        and k_pages.dtype == v_pages.dtype
        and k_pages.shape == v_pages.shape
        and k_pages.shape[3] == q.shape[2]
        and k_pages.shape[2] > 0
        and q.shape[1] % k_pages.shape[2] == 0
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


class Launch(NamedTuple):
    """A launch's grid: row blocks per kv head, key-range splits and key tiles per split."""

    row_blocks: int
    splits: int
    tiles_per_split: int


def launch_shape(
    tokens: int,
    group: int,
    nkv: int,
    d: int,
    start: int,
    *,
    itemsize: int,
    sms: int,
    splits: int | None = None,
) -> Launch:
    """The grid of a chunk of ``tokens`` queries (``group`` per kv head) at ``start``: row
    blocks of ROWS (token, head) rows, and the splits of their key tiles (``split_count``
    unless ``splits`` is given), none of them empty for every block."""
    row_blocks = -(-(tokens * group) // ROWS)
    max_tiles = -(-(start + tokens) // tile_keys(d))
    if splits is None:
        per_sm = max(1, MAX_SHARED // smem_bytes(d, itemsize))
        splits = split_count(row_blocks * nkv, max_tiles, sms, per_sm)
    splits = max(1, min(int(splits), max_tiles))
    per_split = -(-max_tiles // splits)
    return Launch(row_blocks, -(-max_tiles // per_split), per_split)


def _check_device(
    name: str, a: Any, ndim: int, dtypes: tuple[Any, ...], *, vectors: bool = True
) -> None:
    check_array(name, a, dtypes, ndim)
    if vectors and a.data.ptr % 16:
        raise ValueError(f"{name}: must be 16-byte aligned (rows are read as vectors)")


def _check_shapes(q: Any, k_pages: Any, v_pages: Any, pages: Any, start: int) -> None:
    t, nq, d = q.shape
    _, page, nkv, dk = k_pages.shape
    if v_pages.shape != k_pages.shape or v_pages.dtype != k_pages.dtype:
        raise ValueError(
            f"v_pages: {v_pages.shape} {v_pages.dtype} differs from k_pages "
            f"{k_pages.shape} {k_pages.dtype}"
        )
    if d not in HEAD_DIMS:
        raise ValueError(f"q: head dim {d} not supported (one of {HEAD_DIMS})")
    if dk != d:
        raise ValueError(f"k_pages: head dim {dk}, expected {d} like q")
    if nkv == 0 or nq % nkv:
        raise ValueError(f"q: {nq} heads are not a multiple of the {nkv} kv heads")
    if start < 0 or start + t > pages.shape[0] * page:
        raise ValueError(
            f"start: {start} + {t} queries exceeds the {pages.shape[0]} pages of {page} tokens"
        )
    if pages.shape[0] * page >= 2**31:
        raise ValueError("pages: the page list's reach must fit in int32")


def prefill_attention(
    q: Any,
    k_pages: Any,
    v_pages: Any,
    pages: Any,
    *,
    start: int,
    scale: float,
    precision: str = "split_qk",
    splits: int | None = None,
) -> Any:
    """q [T, Nq, D] float32 at positions ``start .. start+T-1`` over the lane's keys/values
    in k_pages, v_pages [num_pages, PAGE, Nkv, D] (float32, uint16 bfloat16 words or uint8
    E4M3 bytes; C-contiguous, 16-byte aligned): token t is row ``t % PAGE`` of page
    ``pages[t // PAGE]`` (int32 [>= ceil((start+T) / PAGE)]), tokens through start+T-1
    written. -> float32 [T, Nq, D], a new array. ``splits`` overrides the key-range split
    count (tests)."""
    import cupy as cp

    _check_device("q", q, 3, (np.float32,))
    _check_device("k_pages", k_pages, 4, tuple(STORAGE))
    _check_device("v_pages", v_pages, 4, tuple(STORAGE))
    _check_device("pages", pages, 1, (np.int32,), vectors=False)
    if precision not in PRECISIONS:
        raise ValueError(f"precision: {precision!r}, expected one of {sorted(PRECISIONS)}")
    start = int(start)
    _check_shapes(q, k_pages, v_pages, pages, start)
    t, nq, d = q.shape
    page, nkv = k_pages.shape[1], k_pages.shape[2]
    out = cp.empty((t, nq, d), dtype=cp.float32)
    if t == 0 or nq == 0:
        return out
    group = nq // nkv
    itemsize = k_pages.dtype.itemsize
    shape = launch_shape(t, group, nkv, d, start, itemsize=itemsize, sms=sm_count(), splits=splits)
    if shape.row_blocks > 65535:
        raise ValueError(f"q: {t} tokens x {group} heads per kv head is too many rows")
    shared = smem_bytes(d, itemsize)
    name = f"prefill_attention<{d}, {PRECISIONS[precision]}, {STORAGE[k_pages.dtype]}>"
    kernel = function(FAMILY, name, shared=shared)
    if shape.splits > 1:
        ws_o = cp.empty((shape.splits, t * nq, d), dtype=cp.float32)
        ws_ml = cp.empty((shape.splits, t * nq, 2), dtype=cp.float32)
    else:
        ws_o = ws_ml = out  # not touched
    kernel(
        (nkv, shape.row_blocks, shape.splits),
        (THREADS,),
        (
            q,
            k_pages,
            v_pages,
            pages,
            out,
            ws_o,
            ws_ml,
            np.int32(t),
            np.int32(nq),
            np.int32(nkv),
            np.int32(page),
            np.int32(start),
            np.int32(shape.tiles_per_split),
            np.float32(scale * LOG2E),
        ),
        shared_mem=shared,
    )
    if shape.splits > 1:
        function(FAMILY, f"prefill_combine<{d}>")(
            (t * nq,), (d // 4,), (ws_o, ws_ml, out, np.int32(t * nq), np.int32(shape.splits))
        )
    return out
