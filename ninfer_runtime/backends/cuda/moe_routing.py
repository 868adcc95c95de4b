"""Routing a MoE block's rows on the device: the router's top-k choice (``route``) and, for a
prefill pass, the (token, expert) pairs laid out by expert in groups (``PairGroups``).

Both run on CuPy arrays with nothing read back (graph-capturable); ``PairGroups`` also lays
numpy ids out by array operations, the kernels' oracle. The kernels are ``kernels/moe.cu``'s,
a family this module registers (the block's elementwise kernels, in ``moe.py``, are in it too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...arrays import array_module
from .compile import function, register_family

#: must match MOE_ROUTER_THREADS / MOE_MAX_EXPERTS / MOE_MAX_TOP_K / MOE_GROUP_THREADS /
#: MOE_CHUNK_PAIRS in kernels/moe.cu
ROUTER_THREADS = 256
GROUP_THREADS = 1024
CHUNK_PAIRS = 512
MAX_EXPERTS = 1024
MAX_TOP_K = 64

register_family(
    "moe", ["moe_router", "moe_silu_mul", "moe_combine", "moe_pair_ranks", "moe_pair_rows"]
)


@dataclass(frozen=True)
class PairGroups:
    """A prefill pass's (token, slot) pairs laid out by expert in groups of ``size`` rows:
    ``row[p]`` is the grouped row of pair ``p`` (in token-major order), ``expert[g]`` group
    g's expert, ``source[r]`` the token grouped row r belongs to. A pair's rank among its
    expert's pairs is the number of earlier pairs of that expert; expert e's groups follow
    those of the experts below it. There are as many groups as a pass of this many pairs can
    need (each expert's pairs in whole groups: at most pairs / size + experts), so nothing
    is read back to size the launches; groups past the real ones have expert -1, and rows no
    pair takes are padding (source -1). ``live[g]``: the pairs group g holds, in its first
    rows (0 past the real groups)."""

    row: Any  # int64 [P]
    expert: Any  # int32 [G]
    source: Any  # int32 [G * size]
    live: Any  # int32 [G]
    size: int

    @property
    def rows(self) -> int:
        return int(self.expert.size) * self.size

    @classmethod
    def of(cls, ids: Any, experts: int, size: int) -> PairGroups:
        """From the router's choice ``ids`` [N, k], on its device with nothing read back:
        two launches over chunks of ``CHUNK_PAIRS`` pairs on CuPy arrays (``moe_pair_ranks``:
        ranks within a chunk and the chunks' counts; ``moe_pair_rows``: the rows), the same
        layout by array operations on numpy ones (the kernels' oracle)."""
        k = int(ids.shape[-1])
        if array_module(ids) is np:
            return cls._of_numpy(np.asarray(ids).reshape(-1), experts, size, k)
        import cupy as cp

        flat = cp.ascontiguousarray(ids.reshape(-1), dtype=cp.int32)
        pairs = int(flat.size)
        count = pairs // size + experts
        chunks = max(1, -(-pairs // CHUNK_PAIRS))
        ranks = cp.empty(pairs + chunks * experts, dtype=cp.int32)  # in its chunk | counts
        chunk_rank, chunk_counts = ranks[:pairs], ranks[pairs:]
        row = cp.empty(pairs, dtype=cp.int64)
        group_expert = cp.empty(count, dtype=cp.int32)
        live = cp.empty(count, dtype=cp.int32)
        source = cp.empty(count * size, dtype=cp.int32)
        function("moe", "moe_pair_ranks")(
            (chunks,),
            (CHUNK_PAIRS,),
            (
                flat,
                np.int32(pairs),
                np.int32(experts),
                chunk_rank,
                chunk_counts,
                np.int32(count * size),
                source,
            ),
        )
        function("moe", "moe_pair_rows")(
            (chunks,),
            (GROUP_THREADS,),
            (
                flat,
                np.int32(pairs),
                np.int32(experts),
                np.int32(size),
                np.int32(k),
                chunk_rank,
                chunk_counts,
                np.int32(chunks),
                np.int32(count),
                row,
                group_expert,
                live,
                source,
            ),
        )
        return cls(row, group_expert, source, live, size)

    @classmethod
    def _of_numpy(cls, flat: np.ndarray, experts: int, size: int, k: int) -> PairGroups:
        pairs = np.arange(flat.size)
        seen = np.cumsum(flat[:, None] == np.arange(experts)[None, :], axis=0, dtype=np.int32)
        counts = seen[-1] if flat.size else np.zeros(experts, dtype=np.int32)
        within = seen[pairs, flat] - 1  # earlier pairs of the same expert
        groups = (counts + size - 1) // size
        ends = np.cumsum(groups)
        row = ((ends[flat] - groups[flat] + within // size) * size + within % size).astype(np.int64)
        slots = np.arange(flat.size // size + experts)
        real = slots < ends[-1]
        group_expert = np.where(real, np.searchsorted(ends, slots, side="right"), -1)
        e = np.maximum(group_expert, 0)
        earlier = (slots - (ends[e] - groups[e])) * size  # the expert's pairs in earlier groups
        live = np.where(real, np.minimum(size, counts[e] - earlier), 0).astype(np.int32)
        source = np.full(slots.size * size, -1, dtype=np.int32)
        source[row] = (pairs // k).astype(np.int32)
        return cls(row, group_expert.astype(np.int32), source, live, size)


def route(logits: Any, top_k: int, experts: int | None = None) -> tuple[Any, Any]:
    """``(ids int32 [N, k], shares float32 [N, k])`` from the router logits in the first
    ``experts`` columns (all by default) of C-contiguous float32 ``logits``."""
    import cupy as cp

    n, width = logits.shape
    e = width if experts is None else experts
    if e > MAX_EXPERTS or not 0 < top_k <= min(e, MAX_TOP_K) or e > width:
        raise ValueError(f"router kernel: {e} experts, top {top_k} out of range")
    logits = cp.ascontiguousarray(logits, dtype=cp.float32)
    ids = cp.empty((n, top_k), dtype=cp.int32)
    shares = cp.empty((n, top_k), dtype=cp.float32)
    function("moe", "moe_router")(
        (n,),
        (ROUTER_THREADS,),
        (logits, np.int32(width), np.int32(e), np.int32(top_k), ids, shares),
    )
    return ids, shares
