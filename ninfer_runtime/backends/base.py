"""The contract between model code and the machine that runs it.

Model files (``models/<arch>/``) describe the math once; a backend supplies the weights, the
few heavy operations the math needs (projections, RoPE) on its own arrays, and the device
services (compiled steps, the sampler, the memory budget). Op families (attention over the
paged K/V, the Gated DeltaNet delta rule, the mixture of experts, the norms, ...) live in the
op catalogue, ``ninfer_runtime/ops/<family>/``, and are resolved per device there. The CPU
backend is the float32 numpy reference; a CUDA backend implements the same protocol with packed
quantized weights and kernels, so the model code never changes.

Conventions shared by every backend:

* Arrays are the backend's array type (``backend.xp`` is its numpy-compatible module) holding
  float32 activations; token ids are int arrays.
* A ``Weight`` is an opaque handle made by ``prepare``: the model only passes it back to ops.
  Small tensors that elementwise glue needs (norm vectors, the conv kernel, ``a_log``) are
  turned into plain arrays once with ``backend.array``.
* Ops that carry state (the families' K/V writes, the delta rule's prefill, decode and
  commit) update the state arrays **in place**: states live in preallocated buffers
  (``SequenceState``) so a GPU backend can keep them resident and a scheduler can address
  them by slot.
* Shapes use ``T`` for tokens of one lane, ``N`` for rows of a batch (all lanes stacked).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

import numpy as np

#: An array of the backend's array module (``numpy.ndarray`` on CPU).
Array = Any


@runtime_checkable
class Weight(Protocol):
    """A prepared parameter. Only its logical shape is public; the storage is the backend's."""

    @property
    def shape(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class ExpertWeights:
    """One gated MLP: ``down(silu(gate x) * up x)`` (a routed expert or the shared expert)."""

    gate: Weight  # [I, H]
    up: Weight  # [I, H]
    down: Weight  # [H, I]


@dataclass(frozen=True)
class MoeWeights:
    """A Qwen3.5-MoE block: softmax router over all experts, renormalised top-k, and a shared
    expert scaled by a sigmoid score. Kept together so a provider of the moe family's
    ``block`` (``ops/moe``) can fuse the whole block."""

    router: Weight  # [E, H]
    experts: Sequence[ExpertWeights | None]  # None: held by another rank (its pairs are its)
    shared: ExpertWeights
    shared_score: Weight  # [1, H]
    top_k: int
    #: None, or a device int32 array [E] the block adds each chosen (row, expert) pair to:
    #: expert offload counts so the pairs of calls whose routing never leaves the device
    hits: Any = None


class Backend(Protocol):
    """Operations a model may ask of a machine. See the module docstring for conventions."""

    name: str
    xp: ModuleType

    def prepare(self, artifact: Any, names: Iterable[str]) -> dict[str, Weight]:
        """Load each logical parameter once (``artifact.parameter(name, in_order=True)``) into
        backend form."""
        ...

    def array(self, weight: Weight) -> Array:
        """A small parameter (norm weight, conv kernel, ``a_log``) as a float32 array."""
        ...

    def join_rows(self, weights: list[Weight]) -> Weight:
        """One weight with the rows of ``weights`` stacked in order (same column count), so
        projections of the same input run as one product (Q|K|V, gate|up)."""
        ...

    def embedding(self, ids: Array, table: Weight) -> Array:
        """Rows of ``table`` [R, H] for ``ids`` [N] -> [N, H]."""
        ...

    def linear(self, x: Array, w: Weight) -> Array:
        """``x @ wᵀ``: x [N, K], w [M, K] (``nn.Linear`` convention) -> [N, M]."""
        ...

    def gated_linear(self, gate_up: Array, w: Weight) -> Array:
        """The gated MLP's down projection: ``linear(silu(gate) * up, w)`` with gate | up the
        two halves of gate_up's last axis (gate_up [N, 2I], w [H, I])."""
        ...

    def rope(self, x: Array, cos: Array, sin: Array) -> Array:
        """Rotate the first ``rd = cos.shape[-1]`` dims of every head, NeoX rotate-half pairs
        (i, i + rd/2): x [N, heads, D], cos/sin [N, rd] -> [N, heads, D]."""
        ...

    def device_sampler(self) -> Any:
        """A sampler that picks tokens where the logits live (``None``: the host samples)."""
        ...

    def context_budget(self, headroom: int | None = None) -> int | None:
        """Bytes the context pool may take under ``--context-capacity auto``, leaving
        ``headroom`` bytes of the device free (``None``: the backend's default); ``None``:
        no device limit, every lane gets a full context."""
        ...

    def device_workspace(self, config: Any, rows: int, logit_rows: int) -> int:
        """Device bytes the backend takes beside the weights and the context pool for
        prefill calls of up to ``rows`` token rows, ``logit_rows`` of them scored, of the
        model its text ``config`` describes (what ``--vram-budget`` plans as workspace)."""
        ...

    def compile_step(
        self, fn: Callable[..., Any], shapes: Sequence[tuple[int, ...]], capture: bool = True
    ) -> Callable[..., Any]:
        """Make ``fn(*inputs)`` (device int32 arrays of ``shapes``, returning device arrays)
        callable with host arrays. The CPU runs it as it is; the CUDA backend captures it
        once into a CUDA graph and replays it (so ``fn`` must not synchronise), unless
        ``capture`` is False (a step that reads the host runs eagerly)."""
        ...


def to_numpy(x: Any) -> np.ndarray:
    """A host copy of a backend array: numpy passes through; an array with a ``get`` (CuPy's,
    the tests' emulated device arrays of ``tests/strict_device.py``, a numpy subclass) is
    copied down."""
    get = getattr(x, "get", None)  # cupy.ndarray.get() copies to the host
    if callable(get):
        return get()
    return x if isinstance(x, np.ndarray) else np.asarray(x)
