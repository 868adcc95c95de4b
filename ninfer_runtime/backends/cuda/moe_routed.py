"""Routed experts a block chose itself, on the expert GEMVs: the moe family's
``routed_experts`` on CUDA (``ops/moe/nvrtc.py``). A ``RoutedTable`` holds the device
addresses of a layer's experts' gate|up and down rows (as ``moe_experts.ExpertTable`` does for
the Qwen3.5-MoE block, which routes on the device itself); ``routed`` runs a decode step's
pairs through it: gate|up of every pair in one launch (two where gate and up are separate
objects), the SwiGLU (clamped where the experts' ``limit`` says) as array math, down in one
launch, and the pairs summed with their weights. Nothing is read back, so a step of these
launches can be captured.

An expert may be None (held in host memory): its entries point at a held expert and its
pairs' weights are zeroed, so the launches stay the same; expert offload adds those pairs.
The table holds weak references to the experts it was built from: it serves only the same
experts, alive (a streamed window's experts are new objects, and their device rows go with
them)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..array_ops import silu
from .moe import padded
from .moe_experts import ExpertTableError, Projection, _single_segment, expert_gemv

__all__ = ["RoutedTable", "routed"]


class RoutedTable:
    """Device tables of ``experts`` (each None or with ``gate_up`` [2I, H], ``down`` [H, I]
    packed weights of single segments, every expert alike, and a ``limit``)."""

    def __init__(self, experts: Sequence[Any]):
        import cupy as cp

        held = [ex is not None for ex in experts]
        if not any(held):
            raise ExpertTableError("no routed expert of the layer is on the device")
        stand_in = experts[held.index(True)]
        full = [ex if ex is not None else stand_in for ex in experts]
        self.held = None if all(held) else cp.asarray(np.array(held, dtype=np.float32))
        parts = [getattr(ex.gate_up, "segments", ()) for ex in full]
        if all(len(p) == 1 for p in parts):  # gate and up rows in one object, in order
            self.gate_up, self.up = Projection.build([p[0] for p in parts], "gate|up"), None
        elif all(len(p) == 2 for p in parts):
            self.gate_up = Projection.build([p[0] for p in parts], "gate")
            self.up = Projection.build([p[1] for p in parts], "up")
        else:
            raise ExpertTableError("experts' gate|up weights are not packed alike")
        down = [_single_segment(ex.down, f"expert {e} down") for e, ex in enumerate(full)]
        self.down = Projection.build(down, "down")
        self.intermediate, self.hidden = self.down.planes.columns, self.down.rows
        gate_rows = self.gate_up.rows + (self.up.rows if self.up is not None else 0)
        if gate_rows != 2 * self.intermediate or self.gate_up.planes.columns != self.hidden:
            raise ExpertTableError("experts' gate|up and down do not form a gated MLP")
        self.limit = stand_in.limit
        self._experts = [None if ex is None else weakref.ref(ex) for ex in experts]

    def serves(self, experts: Sequence[Any]) -> bool:
        """Whether these are the experts (the same objects, alive) the table was built from."""
        if len(experts) != len(self._experts):
            return False
        for ex, ref in zip(experts, self._experts, strict=True):
            if (ex is None) != (ref is None) or (ref is not None and ref() is not ex):
                return False
        return True


def routed(x: Any, table: RoutedTable, top: Any, weights: Any) -> Any:
    """The routed share [N, H] of rows x [N, H] float32: row n's experts ``top`` [N, k] (int)
    weighted by ``weights`` [N, k]; pair p = n * k + j."""
    import cupy as cp

    n, k = top.shape
    inter, hidden = table.intermediate, table.hidden
    ids = cp.ascontiguousarray(top, dtype=cp.int32)
    shares = weights.astype(cp.float32)
    if table.held is not None:
        shares = shares * table.held[ids]
    x = cp.ascontiguousarray(x, dtype=cp.float32)
    gu = cp.empty((n * k, 2 * inter), dtype=cp.float32)  # gate | up of every pair
    expert_gemv(table.gate_up, ids, padded(x, table.gate_up.planes), False, gu, 2 * inter)
    if table.up is not None:
        up_x = padded(x, table.up.planes)
        expert_gemv(table.up, ids, up_x, False, gu[:, inter:], 2 * inter)
    gate, up = gu[:, :inter], gu[:, inter:]
    if table.limit is not None:
        gate, up = cp.minimum(gate, table.limit), cp.clip(up, -table.limit, table.limit)
    h = padded(cp.ascontiguousarray(silu(gate) * up), table.down.planes)
    y = cp.empty((n * k, hidden), dtype=cp.float32)
    expert_gemv(table.down, ids, h, True, y, hidden)
    return (y.reshape(n, k, hidden) * shares[:, :, None]).sum(axis=1)
