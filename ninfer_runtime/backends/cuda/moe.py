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

Math (the CPU reference, ``CpuBackend.moe``): softmax over all experts, top-k by probability
(ties to the lower index), shares divided by their sum, routed output
``sum_j share_j * down(silu(gate x) * up x)``, plus ``sigmoid(shared_score x) * shared(x)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from ...arrays import array_module
from ..base import MoeWeights, Weight
from . import formats as F
from . import gguf_blocks, kernels, prefill
from .compile import function, register_family
from .constants import device_constant

#: must match MOE_ROUTER_THREADS / MOE_MAX_EXPERTS / MOE_MAX_TOP_K / MOE_GROUP_THREADS /
#: MOE_CHUNK_PAIRS in kernels/moe.cu
ROUTER_THREADS = 256
GROUP_THREADS = 1024
CHUNK_PAIRS = 512
MAX_EXPERTS = 1024
MAX_TOP_K = 64
#: threads per block of the elementwise helpers
THREADS = 256
#: most token rows one ``moe_prefill`` pass takes (its groups are one launch's grid rows,
#: at most 65535, and its per-pair buffers stay a few hundred MB)
PREFILL_ROWS = 4096
MAX_GRID_Y = 65535

EXPERTS_FAMILY = "gemv_experts"
#: the files holding the layout policies the expert GEMV instantiates
POLICY_FILES = ("gemv_row_split", "gemv_nvfp4", "gemv_fp8", "gemv_bf16")
_SUFFIX = {F.Q4: "q4", F.Q5: "q5", F.Q6: "q6", F.Q8: "q8", F.NF4: "nf4"}
_SUFFIX.update({F.NVFP4: "nvfp4", F.FP8: "fp8", F.BF16: "bf16"})
#: compiled (rows per warp, K split) pairs: everything the M = 1 defaults of kernels.py pick
EXPERT_CONFIGS = [(r, ks) for r in (2, 4, 8) for ks in kernels.K_SPLITS]
#: pairs of one expert per weight load in a prefill pass: on the GEMV (its most activation
#: rows), and on the tensor cores
GROUP_PAIRS = kernels.MAX_GEMV_ROWS
TENSOR_GROUP_PAIRS = 8 * kernels.GROUP_TILES
#: the configuration (``kernels.GROUP_CONFIGS``) of the shared expert's groups: every row
#: is live there, so the group size sets how many blocks a launch has and how often each
#: weight is decoded (the 35B-A3B's 2,048 rows, the shared expert in ms: 64-row groups 0.238,
#: 96-row 0.245 (176 blocks, fewer than run at once), 32-row 0.253 (each weight decoded 64
#: times); `linear`, a bf16 slab and cuBLAS, 0.262)
SHARED_GROUPS = (8, 3, 4)

register_family(
    "moe", ["moe_router", "moe_silu_mul", "moe_combine", "moe_pair_ranks", "moe_pair_rows"]
)
register_family(
    EXPERTS_FAMILY,
    [f"gemv_experts_{s}<{r}, {ks}>" for s in _SUFFIX.values() for r, ks in EXPERT_CONFIGS]
    + [
        f"gemv_expert_groups_{s}<{GROUP_PAIRS}, {kernels.ROWS_PER_WARP[GROUP_PAIRS]}, {ks}>"
        for s in _SUFFIX.values()
        for ks in kernels.K_SPLITS
    ],
    needs=POLICY_FILES,  # the layout policies live in the per-layout GEMV files
)


class ExpertTableError(ValueError):
    """The experts cannot be read by the expert GEMV (the caller should fall back)."""


@dataclass(frozen=True)
class Projection:
    """One projection (gate, up or down) of every expert: ``rows`` rows starting at row
    ``row0[e]`` of the object whose bytes start at device address ``base[e]``."""

    planes: F.Planes
    rows: int
    base: Any  # int64 device array [E]
    row0: Any  # int32 device array [E]

    @classmethod
    def build(cls, segments: list[Any], what: str = "expert") -> Projection:
        """From one ``Segment`` per expert, all of one planes and row count."""
        import cupy as cp

        planes, rows = segments[0].parent.planes, segments[0].rows
        if any(s.parent.planes != planes or s.rows != rows for s in segments):
            raise ExpertTableError(f"experts' {what} weights differ in layout or shape")
        if not planes.gemv or (planes.code not in _SUFFIX and not F.is_gguf(planes.code)):
            raise ExpertTableError(f"experts' {what} layout has no in-place GEMV for this shape")
        base = np.array([s.parent.data.data.ptr for s in segments], dtype=np.int64)
        row0 = np.array([s.row0 for s in segments], dtype=np.int32)
        return cls(planes, rows, cp.asarray(base), cp.asarray(row0))


class ExpertTable:
    """Device tables of a layer's routed experts, built once from its ``MoeWeights``.

    Each expert's gate, up and down must be a ``PackedWeight`` of a single segment, and all
    experts must share the planes (format, layout and geometry) of each projection; otherwise
    ``ExpertTableError`` is raised. ``fused`` is set when every expert's up rows directly
    follow its gate rows in the same object (gate|up packing): one launch then covers both.

    ``join_rows`` (the backend's) stacks the router with the shared-expert score and the
    shared expert's gate with its up, so that each pair is one product where they are packed
    in one object (the converter packs both pairs).

    Under expert parallelism the experts another rank holds are None: their entries point at
    this rank's first expert, and ``held`` (float32 [E], 1 where this rank holds the expert)
    zeroes the shares of their pairs, so the decode launches stay those of every expert here
    and the pairs of other ranks' experts add exactly 0 (the block's all-reduce adds their
    ranks' values); a prefill pass leaves those pairs out of its groups (``_held_groups``).
    """

    def __init__(self, weights: MoeWeights, join_rows: Callable[[list[Weight]], Weight]):
        self.router_score = join_rows([weights.router, weights.shared_score])
        self.router_tf32: Any = None  # its 3xTF32 split for prefill (made once)
        self.shared_gate_up = join_rows([weights.shared.gate, weights.shared.up])
        self.shared_down = weights.shared.down
        self.shared_intermediate = weights.shared.down.shape[1]
        experts = list(weights.experts)
        self.experts = len(experts)
        mine = [ex is not None for ex in experts]
        if not any(mine):
            raise ExpertTableError("this rank holds none of the layer's experts")
        self.held: Any = None
        if not all(mine):
            import cupy as cp

            if self.experts >= MAX_EXPERTS:  # (a prefill groups other ranks' pairs as one more)
                raise ExpertTableError(
                    f"{self.experts} experts held by ranks: at most {MAX_EXPERTS - 1}"
                )

            self.held = cp.asarray(np.array(mine, dtype=np.float32))
            stand_in = experts[mine.index(True)]
            experts = [ex if ex is not None else stand_in for ex in experts]
        self.top_k = int(weights.top_k)
        if not 0 < self.top_k <= min(self.experts, MAX_TOP_K) or self.experts > MAX_EXPERTS:
            raise ExpertTableError(
                f"{self.experts} experts, top {self.top_k}: the router kernel takes at most "
                f"{MAX_EXPERTS} experts and top-{MAX_TOP_K}"
            )
        segs = {
            name: [
                _single_segment(getattr(ex, name), f"expert {e} {name}")
                for e, ex in enumerate(experts)
            ]
            for name in ("gate", "up", "down")
        }
        self.gate, self.up, self.down = (
            Projection.build(segs[name], name) for name in ("gate", "up", "down")
        )
        self.intermediate, self.hidden = self.gate.rows, self.down.rows
        if (
            self.up.rows != self.intermediate
            or self.gate.planes.columns != self.hidden
            or self.up.planes.columns != self.hidden
            or self.down.planes.columns != self.intermediate
        ):
            raise ExpertTableError("expert gate/up/down shapes do not form a gated MLP")
        self.fused = all(
            g.parent is u.parent and u.row0 == g.row0 + g.rows
            for g, u in zip(segs["gate"], segs["up"], strict=True)
        )
        self.shared_groups = _shared_groups(self.shared_gate_up, self.shared_down)


def _shared_groups(gate_up: Weight, down: Weight) -> tuple[Projection, Projection] | None:
    """The shared expert's gate|up and down as one-expert projections of the grouped
    tensor-core product (a prefill chunk's rows in groups of one expert, each group reading
    the codes in place instead of a dequantized slab), where both are single segments of a
    layout that product reads; else None (the prefill then takes ``linear``)."""
    try:
        projections = tuple(
            Projection.build([_single_segment(w, f"shared {what}")], f"shared {what}")
            for w, what in ((gate_up, "gate|up"), (down, "down"))
        )
    except ExpertTableError:
        return None
    if not all(kernels.has_grouped_product(p.planes) for p in projections):
        return None
    return projections[0], projections[1]


def _single_segment(w: Any, what: str) -> Any:
    segments = getattr(w, "segments", None)
    if segments is None or len(segments) != 1:
        raise ExpertTableError(f"{what}: not a packed weight of a single segment")
    return segments[0]


def expert_gemv(
    proj: Projection,
    ids: Any,
    x: Any,
    x_per_pair: bool,
    y: Any,
    ldy: int,
    rows: int | None = None,
    rows_per_warp: int | None = None,
    k_split: int | None = None,
) -> None:
    """``y[p, r] = sum_k x[xrow(p), k] W_{ids[p]}[r, k]`` for the ``P = ids.size`` pairs and
    ``r < rows`` (default ``proj.rows``), with ``xrow(p) = p`` if ``x_per_pair`` else
    ``p // k`` (k = ``ids.shape[1]``). ``ids``: int32 device array [N, k]; ``x``: float32,
    C-contiguous, ``proj.planes.x_width`` columns (zero padded), 16-byte aligned; ``y``:
    float32 device view whose rows are ``ldy`` apart."""
    p = proj.planes
    rows = proj.rows if rows is None else rows
    pairs, k = int(ids.size), int(ids.shape[-1])
    if F.is_gguf(p.code):
        gguf_blocks.experts_gemv(
            proj.base, proj.row0, p, ids, rows, x, y, ldy, k=k, x_per_unit=x_per_pair
        )
        return
    ks = k_split or kernels.default_k_split(p.code, rows, p.units)
    r = rows_per_warp or kernels.default_rows_per_warp(p.code, 1, rows, ks)
    per_block = kernels.GEMV_WARPS // ks * r
    function(EXPERTS_FAMILY, f"gemv_experts_{_SUFFIX[p.code]}<{r}, {ks}>")(
        ((rows + per_block - 1) // per_block, pairs),
        (kernels.GEMV_WARPS * 32,),
        (
            proj.base,
            proj.row0,
            ids,
            np.int32(k),
            np.int32(x_per_pair),
            *p.kernel_args(),
            np.int32(rows),
            np.int32(p.units),
            x,
            np.int32(x.shape[1]),
            y,
            np.int32(ldy),
        ),
    )


def expert_groups_gemv(
    proj: Projection, group_expert: Any, x: Any, y: Any, ldy: int, rows: int | None = None
) -> None:
    """``y[g * M + m, r] = sum_k x[g * M + m, k] W_{group_expert[g]}[r, k]`` for every group
    g of ``M = GROUP_PAIRS`` rows and ``r < rows`` (default ``proj.rows``); ``x`` as for
    ``expert_gemv``, ``len(group_expert) * M`` rows."""
    p = proj.planes
    rows = proj.rows if rows is None else rows
    if F.is_gguf(p.code):
        gguf_blocks.experts_gemv(
            proj.base, proj.row0, p, group_expert, rows, x, y, ldy, group=GROUP_PAIRS
        )
        return
    m, ks = GROUP_PAIRS, kernels.default_k_split(p.code, rows, p.units)
    r = kernels.ROWS_PER_WARP[m]
    per_block = kernels.GEMV_WARPS // ks * r
    function(EXPERTS_FAMILY, f"gemv_expert_groups_{_SUFFIX[p.code]}<{m}, {r}, {ks}>")(
        ((rows + per_block - 1) // per_block, int(group_expert.size)),
        (kernels.GEMV_WARPS * 32,),
        (
            proj.base,
            proj.row0,
            group_expert,
            *p.kernel_args(),
            np.int32(rows),
            np.int32(p.units),
            x,
            np.int32(x.shape[1]),
            y,
            np.int32(ldy),
        ),
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


def held_route(logits: Any, table: ExpertTable) -> tuple[Any, Any]:
    """``route`` over the table's experts, the shares of pairs whose expert another rank
    holds set to 0."""
    ids, shares = route(logits, table.top_k, table.experts)
    if table.held is not None:
        shares *= table.held[ids]
    return ids, shares


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


def moe_decode(backend: Any, x: Any, table: ExpertTable) -> Any:
    """The MoE block for ``N = x.shape[0] <= 8`` rows, ``[N, H]`` float32, with device-side
    routing only (no host synchronisation, no device -> host reads): safe to capture.
    Launches: router | shared score, top-k, the experts' gate|up, silu * up, the experts'
    down, the shared expert's gate|up, silu * up and down, and the combine."""
    import cupy as cp

    n = x.shape[0]
    k, inter, hidden = table.top_k, table.intermediate, table.hidden
    pairs = n * k
    x = cp.ascontiguousarray(x, dtype=cp.float32)
    logits = backend.linear(x, table.router_score)  # [N, E + 1]: the score is the last column
    ids, shares = held_route(logits, table)

    gu = cp.empty((pairs, 2 * inter), dtype=cp.float32)  # gate | up of every pair
    if table.fused:
        expert_gemv(
            table.gate, ids, _padded(x, table.gate.planes), False, gu, 2 * inter, rows=2 * inter
        )
    else:
        expert_gemv(table.gate, ids, _padded(x, table.gate.planes), False, gu, 2 * inter)
        expert_gemv(table.up, ids, _padded(x, table.up.planes), False, gu[:, inter:], 2 * inter)
    h = silu_mul(gu, inter, inter, table.down.planes.x_width)
    y = cp.empty((pairs, hidden), dtype=cp.float32)
    expert_gemv(table.down, ids, h, True, y, hidden)

    return _combine(x, table, logits, y, shares, _shared(backend, x, table))


def moe_prefill(backend: Any, x: Any, table: ExpertTable) -> Any:
    """The MoE block for any number of rows ``[N, H]`` float32, all on the device: routed,
    the ``N * k`` pairs grouped by expert (``PairGroups``), each projection one grouped
    launch over them all (``_grouped``), the outputs put back in pair order and combined as
    in ``moe_decode``; passes of at most ``PREFILL_ROWS`` rows."""
    import cupy as cp

    x = cp.ascontiguousarray(x, dtype=cp.float32)
    step = max(1, min(PREFILL_ROWS, MAX_GRID_Y // table.top_k))
    parts = [_prefill_rows(backend, x[a : a + step], table) for a in range(0, x.shape[0], step)]
    return parts[0] if len(parts) == 1 else cp.concatenate(parts)


def _prefill_rows(backend: Any, x: Any, table: ExpertTable) -> Any:
    import cupy as cp

    k, inter, hidden = table.top_k, table.intermediate, table.hidden
    logits = _router_logits(backend, x, table)
    ids, shares = held_route(logits, table)
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
            _padded(xs, table.gate.planes), h, width, x_rows, groups.live, gated=True,
        )  # fmt: skip
    else:
        gu = cp.empty((groups.rows, 2 * inter), dtype=cp.float32)
        if table.fused:
            project(table.gate, _padded(xs, table.gate.planes), gu, 2 * inter, 2 * inter, x_rows)
        else:
            project(table.gate, _padded(xs, table.gate.planes), gu, 2 * inter, None, x_rows)
            project(table.up, _padded(xs, table.up.planes), gu[:, inter:], 2 * inter, None, x_rows)
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
        gate_up.base, gate_up.row0, expert, gate_up.planes, si, _padded(x, gate_up.planes), h,
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


def _padded(x: Any, p: F.Planes) -> Any:
    """x with ``p.x_width`` zero-padded columns, 16-byte aligned (x itself when it is)."""
    import cupy as cp

    if x.shape[1] == p.x_width and x.data.ptr % 16 == 0:
        return x
    out = cp.zeros((x.shape[0], p.x_width), dtype=cp.float32)
    out[:, : x.shape[1]] = x
    return out


def _blocks(total: int) -> int:
    return max(1, min((total + THREADS - 1) // THREADS, 1024))
