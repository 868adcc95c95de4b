"""Mixture-of-experts on the device: graph-capturable decode (N <= 8 token rows) and prefill.

The router's top-k choice never leaves the device: ``moe_router`` writes expert ids and
renormalised shares, and the expert-indexed GEMV (``kernels/gemv_experts.cu``) looks each
pair's expert up in an ``ExpertTable`` of device addresses, so ``moe_decode`` issues a fixed
sequence of launches with no host synchronisation and can be captured in a CUDA graph.
``moe_prefill`` does the same for a prefill chunk's rows: it lays the (token, expert) pairs
out by expert on the device and cuts each expert's pairs into groups (the last padded with zero
rows), so one weight load serves a group; every group of the chunk runs in one launch per
projection, on the tensor cores (``small_*_groups`` of ``gemm_small.cu``, groups of ``8 *
kernels.GROUP_TILES`` rows, of which only the live ones cost) where the layout has a
tensor-core kernel, else on the 8-row GEMV (``gemv_expert_groups``).
No loop over experts on the host, and nothing read back.

Math (the moe family's reference, ``ops/moe/reference.py``): softmax over all experts, top-k
by probability (ties to the lower index), shares divided by their sum, routed output
``sum_j share_j * down(silu(gate x) * up x)``, plus ``sigmoid(shared_score x) * shared(x)``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from ...arrays import array_module
from ..array_ops import count_pairs
from . import formats as F
from . import kernels, prefill
from .compile import function
from .constants import device_constant

# The expert table, the expert GEMVs and the routing are re-exported: the MoE op, the tests
# and the profiling script name them through this module
from .moe_experts import (  # noqa: F401
    EXPERT_CONFIGS,
    GROUP_PAIRS,
    TENSOR_GROUP_PAIRS,
    ExpertTable,
    ExpertTableError,
    Projection,
    expert_gemv,
    expert_groups_gemv,
)
from .moe_routing import (  # noqa: F401
    CHUNK_PAIRS,
    PairGroups,
    route,
)

#: threads per block of the elementwise helpers
THREADS = 256
#: most token rows one ``moe_prefill`` pass takes (its groups are one launch's grid rows,
#: at most 65535, and its per-pair buffers stay a few hundred MB)
PREFILL_ROWS = 4096
MAX_GRID_Y = 65535

#: the configuration (``kernels.GROUP_CONFIGS``) of the shared expert's groups: every row
#: is live there, so the group size sets how many blocks a launch has and how often each
#: weight is decoded (the 35B-A3B's 2,048 rows, the shared expert in ms: 64-row groups 0.238,
#: 96-row 0.245 (176 blocks, fewer than run at once), 32-row 0.253 (each weight decoded 64
#: times); `linear`, a bf16 slab and cuBLAS, 0.262)
SHARED_GROUPS = (8, 3, 4)


def held_route(logits: Any, table: ExpertTable, hits: Any = None) -> tuple[Any, Any]:
    """``route`` over the table's experts, the shares of pairs whose expert another rank
    holds set to 0; each chosen pair added to ``hits`` [E] int32 (None: uncounted)."""
    ids, shares = route(logits, table.top_k, table.experts)
    count_pairs(hits, ids)
    if table.held is not None:
        shares *= table.held[ids]
    return ids, shares


def silu_mul(gu: Any, up: int, inter: int, width: int) -> Any:
    """``silu(gu[:, :inter]) * gu[:, up:up + inter]`` as ``[P, width]`` float32, zero beyond
    ``inter`` (the padding a GEMV reads); ``gu``: C-contiguous float32 rows."""
    import cupy as cp

    pairs = gu.shape[0]
    h = cp.empty((pairs, width), dtype=cp.float32)
    function("moe", "moe_silu_mul")(
        (_blocks(pairs * width),),
        (THREADS,),
        (
            gu,
            np.int32(gu.shape[1]),
            np.int32(up),
            np.int32(inter),
            h,
            np.int32(width),
            np.int32(pairs),
        ),
    )
    return h


def moe_decode(backend: Any, x: Any, table: ExpertTable, hits: Any = None) -> Any:
    """The MoE block for ``N = x.shape[0] <= 8`` rows, ``[N, H]`` float32, with device-side
    routing only (no host synchronisation, no device -> host reads): safe to capture.
    ``hits``: as ``held_route``'s.
    Launches: router | shared score, top-k, the experts' gate|up, silu * up, the experts'
    down, the shared expert's gate|up, silu * up and down, and the combine."""
    import cupy as cp

    n = x.shape[0]
    k, inter, hidden = table.top_k, table.intermediate, table.hidden
    pairs = n * k
    x = cp.ascontiguousarray(x, dtype=cp.float32)
    logits = backend.linear(x, table.router_score)  # [N, E + 1]: the score is the last column
    ids, shares = held_route(logits, table, hits)

    gu = cp.empty((pairs, 2 * inter), dtype=cp.float32)  # gate | up of every pair
    if table.fused:
        expert_gemv(
            table.gate, ids, padded(x, table.gate.planes), False, gu, 2 * inter, rows=2 * inter
        )
    else:
        expert_gemv(table.gate, ids, padded(x, table.gate.planes), False, gu, 2 * inter)
        expert_gemv(table.up, ids, padded(x, table.up.planes), False, gu[:, inter:], 2 * inter)
    h = silu_mul(gu, inter, inter, table.down.planes.x_width)
    y = cp.empty((pairs, hidden), dtype=cp.float32)
    expert_gemv(table.down, ids, h, True, y, hidden)

    return _combine(x, table, logits, y, shares, _shared(backend, x, table))


def moe_prefill(backend: Any, x: Any, table: ExpertTable, hits: Any = None) -> Any:
    """The MoE block for any number of rows ``[N, H]`` float32, all on the device: routed,
    the ``N * k`` pairs grouped by expert (``PairGroups``), each projection one grouped
    launch over them all (``_grouped``), the outputs put back in pair order and combined as
    in ``moe_decode``; passes of at most ``PREFILL_ROWS`` rows. ``hits``: as
    ``held_route``'s."""
    import cupy as cp

    x = cp.ascontiguousarray(x, dtype=cp.float32)
    step = max(1, min(PREFILL_ROWS, MAX_GRID_Y // table.top_k))
    parts = [
        _prefill_rows(backend, x[a : a + step], table, hits) for a in range(0, x.shape[0], step)
    ]
    return parts[0] if len(parts) == 1 else cp.concatenate(parts)


def _prefill_rows(backend: Any, x: Any, table: ExpertTable, hits: Any) -> Any:
    import cupy as cp

    k, inter, hidden = table.top_k, table.intermediate, table.hidden
    logits = _router_logits(backend, x, table)
    ids, shares = held_route(logits, table, hits)
    tensor_cores = _tensor_core_groups(table)
    size = TENSOR_GROUP_PAIRS if tensor_cores else GROUP_PAIRS
    groups = _held_groups(ids, table, size)
    project = partial(_grouped, groups=groups, tensor_cores=tensor_cores)
    if tensor_cores:  # the products gather each pair's token row themselves
        xs, x_rows = x, groups.source
    else:  # each pair's token row laid out by group (rows no pair takes are never read back)
        xs = cp.empty((groups.rows, x.shape[1]), dtype=cp.float32)
        xs[groups.row] = cp.repeat(x, k, axis=0)
        x_rows = None
    width = table.down.planes.x_width
    if tensor_cores and table.fused:  # silu(gate) * up straight from the gate|up product
        h = _hidden_rows(groups.rows, inter, width)
        kernels.small_gemm_groups(
            table.gate.base, table.gate.row0, groups.expert, table.gate.planes, inter,
            padded(xs, table.gate.planes), h, width, x_rows, groups.live, gated=True,
        )  # fmt: skip
    else:
        gu = cp.empty((groups.rows, 2 * inter), dtype=cp.float32)
        if table.fused:
            project(table.gate, padded(xs, table.gate.planes), gu, 2 * inter, 2 * inter, x_rows)
        else:
            project(table.gate, padded(xs, table.gate.planes), gu, 2 * inter, None, x_rows)
            project(table.up, padded(xs, table.up.planes), gu[:, inter:], 2 * inter, None, x_rows)
        h = silu_mul(gu, inter, inter, width)
    # (zeros: the rows of pairs another rank's expert takes are never written)
    ys = (cp.empty if table.held is None else cp.zeros)((groups.rows, hidden), dtype=cp.float32)
    project(table.down, h, ys, hidden)
    shared = _shared_prefill(backend, x, table)
    # the combine reads each (token, slot) pair's row where its group left it
    return _combine(x, table, logits, ys, shares, shared, groups.row)


def _held_groups(ids: Any, table: ExpertTable, size: int) -> PairGroups:
    """The pairs grouped by expert; under expert parallelism the pairs of experts another
    rank holds go to one more expert, after the others, whose groups are then marked as
    padding (expert -1): no product computes them. (CuPy or numpy arrays, as ``PairGroups``.)"""
    if table.held is None:
        return PairGroups.of(ids, table.experts, size)
    xp, nobody = array_module(ids), table.experts
    mine = xp.where(table.held[ids] > 0, ids, nobody).astype(xp.int32)
    groups = PairGroups.of(mine, nobody + 1, size)
    padding = xp.where(groups.expert == nobody, -1, groups.expert).astype(xp.int32)
    return replace(groups, expert=padding)


def _router_logits(backend: Any, x: Any, table: ExpertTable) -> Any:
    """The router | shared score at about float32 accuracy, from its rows decoded once (a
    prefill GEMM's bf16 operands could flip a near tie in the top-k choice): 3xTF32 on the
    tensor cores, its weight split once, or a float32 product where the backend computes
    prefill in float32."""
    import cupy as cp

    w = backend.array(table.router_score)
    if backend.prefill_precision == "float32":
        return cp.ascontiguousarray(x @ w.T, dtype=cp.float32)
    parts = table.router_tf32 if table.router_tf32 is not None else prefill.split_tf32(w, 0)
    if not cp.cuda.get_current_stream().is_capturing():  # (a capture's exist on replay only)
        table.router_tf32 = parts
    return prefill.matmul_3xtf32(x, parts)


def _shared_prefill(backend: Any, x: Any, table: ExpertTable) -> Any:
    """The shared expert over a prefill pass's rows: every row in groups of the one expert
    on the grouped tensor-core product where the table has ``shared_groups``."""
    import cupy as cp

    if table.shared_groups is None:
        return _shared(backend, x, table)
    gate_up, down = table.shared_groups
    n, si, size = x.shape[0], table.shared_intermediate, 8 * SHARED_GROUPS[0]
    count = -(-n // size)
    expert, x_rows, live = device_constant(("one expert", n, size), partial(_one_expert, n, size))
    width = down.planes.x_width
    h = _hidden_rows(count * size, si, width)
    kernels.small_gemm_groups(
        gate_up.base, gate_up.row0, expert, gate_up.planes, si, padded(x, gate_up.planes), h,
        width, x_rows, live, config=SHARED_GROUPS, gated=True,
    )  # fmt: skip
    out = cp.empty((count * size, table.hidden), dtype=cp.float32)
    kernels.small_gemm_groups(
        down.base, down.row0, expert, down.planes, table.hidden, h, out, table.hidden,
        group_rows=live, config=SHARED_GROUPS,
    )  # fmt: skip
    return out[:n]


def _one_expert(n: int, size: int) -> tuple[Any, Any, Any]:
    """n rows in groups of ``size`` of one expert: each group's expert (0), each grouped
    row's token (-1 for the last group's padding, which reads zeros), each group's rows."""
    import cupy as cp

    count = -(-n // size)
    x_rows = cp.arange(count * size, dtype=cp.int32)
    x_rows[n:] = -1
    live = cp.minimum(size, n - size * cp.arange(count, dtype=cp.int32)).astype(cp.int32)
    return cp.zeros(count, dtype=cp.int32), x_rows, live


def _hidden_rows(rows: int, inter: int, width: int) -> Any:
    """The gated hidden rows a down projection reads: [rows, width] float32, the columns past
    ``inter`` zero (the padding its kernel reads)."""
    import cupy as cp

    return (cp.empty if width == inter else cp.zeros)((rows, width), dtype=cp.float32)


def _tensor_core_groups(table: ExpertTable) -> bool:
    """Whether every routed projection of the table has the grouped tensor-core product."""
    return all(kernels.has_grouped_product(p.planes) for p in (table.gate, table.up, table.down))


def _grouped(
    proj: Projection,
    x: Any,
    y: Any,
    ldy: int,
    rows: int | None = None,
    x_rows: Any = None,
    *,
    groups: PairGroups,
    tensor_cores: bool,
) -> None:
    """One projection of every group (``rows``: default ``proj.rows``); x holds the groups'
    rows in order, or (tensor cores) any rows that ``x_rows`` picks for them."""
    rows = proj.rows if rows is None else rows
    if tensor_cores:
        kernels.small_gemm_groups(
            proj.base, proj.row0, groups.expert, proj.planes, rows, x, y, ldy, x_rows, groups.live
        )
    else:
        expert_groups_gemv(proj, groups.expert, x, y, ldy, rows=rows)


def _shared(backend: Any, x: Any, table: ExpertTable) -> Any:
    """The shared expert's output (before its sigmoid gate) for the rows of x."""
    import cupy as cp

    si = table.shared_intermediate
    shared_h = silu_mul(backend.linear(x, table.shared_gate_up), si, si, si)
    return cp.ascontiguousarray(backend.linear(shared_h, table.shared_down), dtype=cp.float32)


def _combine(
    x: Any,
    table: ExpertTable,
    logits: Any,
    y: Any,
    shares: Any,
    shared: Any,
    y_rows: Any = None,
) -> Any:
    """``sum_j share_j y[(n, j)] + sigmoid(score) * shared`` for the rows of x, from the
    routed pairs' outputs ``y`` (pair p = n * k + j in row p, or in row ``y_rows[p]``, int64),
    the router | score ``logits`` and the shared expert's C-contiguous rows."""
    import cupy as cp

    n, k, hidden = x.shape[0], table.top_k, table.hidden
    out = cp.empty((n, hidden), dtype=cp.float32)
    function("moe", "moe_combine")(
        (_blocks(n * hidden),),
        (THREADS,),
        (
            y,
            np.int32(hidden),
            np.uint64(0) if y_rows is None else y_rows,  # a null pointer: rows in pair order
            shares,
            np.int32(k),
            shared,
            logits[:, table.experts :],
            np.int32(logits.shape[1]),
            np.int32(hidden),
            np.int32(n),
            out,
        ),
    )
    return out


def padded(x: Any, p: F.Planes) -> Any:
    """x with ``p.x_width`` zero-padded columns, 16-byte aligned (x itself when it is)."""
    import cupy as cp

    if x.shape[1] == p.x_width and x.data.ptr % 16 == 0:
        return x
    out = cp.zeros((x.shape[0], p.x_width), dtype=cp.float32)
    out[:, : x.shape[1]] = x
    return out


def _blocks(total: int) -> int:
    return max(1, min((total + THREADS - 1) // THREADS, 1024))
