"""Weights the device reads in place from pinned host memory (expert offload's ``mapped``
decode).

On a platform with unified addressing (every 64-bit one CUDA supports), page-locked host
memory from ``cudaHostAlloc`` is addressable by kernels at its host address: a kernel given
such a weight pulls its bytes over the host link as it reads them, with no copy issued and
nothing for the host to do. ``MappedWeights.of`` turns weights prepared on the device into the
same weights on pinned host bytes: the same planes, rows and segments, each parent's bytes
copied once into pinned slabs (the backend's ``expert_streaming.PinnedCuts``, by the parent's
key: an expert mapped again reuses its bytes, and a prefill window that streams the expert
uploads them from there, cutting nothing). Every kernel that reads the device's weights by
address (the expert tables' GEMVs and grouped products) reads these alike, and a step that
reads them is captured as any other. What a use costs is the link: each pair reads its
expert's stored bytes from host memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .expert_streaming import PinnedCuts
from .weight_kinds import PackedWeight, Parent, Segment

__all__ = ["MappedWeights", "MappingError", "device_view"]


class MappingError(ValueError):
    """A weight the device cannot read in place from host memory (not held as stored rows)."""


def device_view(cp: Any, host: np.ndarray) -> Any:
    """A CuPy uint8 array over pinned ``host`` bytes, at their host address (unified
    addressing); it keeps ``host`` alive."""
    memory = cp.cuda.UnownedMemory(host.ctypes.data, host.nbytes, host, cp.cuda.Device().id)
    return cp.ndarray((host.nbytes,), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(memory, 0))


class MappedWeights:
    """Pinned host copies of prepared weights' parents, and the weights on them."""

    def __init__(self, cp: Any, kept: PinnedCuts):
        """``kept``: where the copies are kept (pinned whatever its allowance)."""
        self.cp, self.kept = cp, kept

    def of(self, weights: Mapping[str, Any]) -> dict[str, PackedWeight]:
        """``weights`` (name -> a ``PackedWeight`` prepared on the device) on pinned host
        copies of their parents, one copy a parent however many weights share it (gate and
        up in one window keep the expert table's fused launch); ``MappingError`` for a
        weight held otherwise (a float32 copy)."""
        parents: dict[int, Parent] = {}
        out = {}
        for name, w in weights.items():
            if not isinstance(w, PackedWeight):
                raise MappingError(f"{name}: held as a float32 copy, not stored rows")
            segments = [
                Segment(self._parent(parents, s.parent), s.row0, s.rows) for s in w.segments
            ]
            out[name] = PackedWeight(segments, w.shape, w.input_columns)
        return out

    def _parent(self, made: dict[int, Parent], parent: Parent) -> Parent:
        if id(parent) not in made:
            host = self.kept.get(parent.object_id)
            if host is None:
                host = self.kept.keep(parent.object_id, self.cp.asnumpy(parent.data), pin=True)
            made[id(parent)] = Parent(parent.object_id, device_view(self.cp, host), parent.planes)
        return made[id(parent)]
