"""A MoE layer's routed experts on the device: their table of device addresses
(``ExpertTable``, built once from the layer's ``MoeWeights``) and the expert-indexed GEMVs that
read it (``kernels/gemv_experts.cu``): ``expert_gemv``, one product per (token, expert) pair
(decode), and ``expert_groups_gemv``, one per group of an expert's pairs (prefill).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..base import MoeWeights, Weight
from . import formats as F
from . import gguf_blocks, kernels
from .compile import function, register_family
from .moe_routing import MAX_EXPERTS, MAX_TOP_K

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
