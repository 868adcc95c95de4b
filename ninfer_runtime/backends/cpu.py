"""The float32 numpy reference backend.

Every weight is decoded once to float32 and every op is written in the plainest numpy that
states the math, so this backend is the oracle the CUDA kernels are tested against. Speed is
secondary: BLAS does the matrix products, everything else is vectorised over heads.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ninfer_format.progress import silent, terminal_bar

from ..lane_limits import MAX_LANES
from . import array_ops as ops
from .base import Array, Weight

#: Up to this many rows a product is one matrix-vector product per row, so a row's result
#: never depends on which rows share the call: a decode step of any lane count and a
#: speculative verification give bit-identical rows (BLAS picks other kernels, with other
#: summation orders, for other row counts).
ROW_STABLE_ROWS = 64
#: a prepare of this many parameters or more is a model's load and draws a progress bar; fewer
#: (the few experts an offload window streams for one layer's prefill chunk) load quietly
LOAD_BAR_FROM = 64


class CpuBackend(ops.ReferenceOps):
    """Backend protocol on numpy; a ``Weight`` here is simply a float32 ndarray."""

    name = "cpu"
    xp = np
    #: the product's most lanes: nothing here is sized by rows, and a decode step of up to
    #: ``ROW_STABLE_ROWS`` rows keeps every row's result independent of the others
    max_lanes = MAX_LANES
    #: K/V with ``kv_dtype`` auto: exactly, as the oracle computes
    kv_dtype = "float32"
    #: prompt tokens a step when the engine is given no ``prefill_chunk``
    prefill_chunk = 512

    # ------------------------------------------------------------------------ weights
    def prepare(self, artifact: Any, names: Iterable[str]) -> dict[str, Weight]:
        names = list(names)
        weights: dict[str, Weight] = {}
        bar = terminal_bar if len(names) >= LOAD_BAR_FROM else silent
        with bar(len(names), "loading weights", "parameter") as advance:
            for name in names:
                values = artifact.parameter(name, in_order=True)
                weights[name] = np.ascontiguousarray(values, dtype=np.float32)
                advance(1)
        return weights

    def prepare_mapped(self, artifact: Any, names: Iterable[str]) -> dict[str, Weight]:
        """Weights the "device" reads in place from host memory (expert offload's
        ``mapped`` decode, as a GPU reads pinned host bytes): here host memory is the
        device's, so they are the prepared weights."""
        return self.prepare(artifact, names)

    def array(self, weight: Weight) -> Array:
        return weight

    def device_workspace(self, config: Any, rows: int, logit_rows: int) -> int:
        """No device bytes beside weights and context: this backend's "device" is host
        memory, simulated (``--vram-budget`` plans stored sizes as a GPU would hold them)."""
        return 0

    def join_rows(self, weights: list[Weight]) -> Weight:
        return np.concatenate(weights, axis=0)

    # ------------------------------------------------------------------ dense algebra
    def embedding(self, ids: Array, table: Weight) -> Array:
        return table[np.asarray(ids, dtype=np.int64)]  # type: ignore[index]

    def linear(self, x: Array, w: Weight) -> Array:
        if 0 < x.shape[0] <= ROW_STABLE_ROWS:
            return np.stack([w @ row for row in x])  # type: ignore[operator]
        return x @ w.T  # type: ignore[attr-defined]
