"""The CPU backend as the CUDA backend would hold its arrays: on the strict device of
``tests/strict_device.py`` (numpy arrays that refuse host arrays as CuPy's do), under the name
``cuda`` so the op policies pick their ``cuda`` rows.

* ``StrictCudaBackend``: weights and every array it returns are device arrays, and its methods
  refuse host activations where ``backends/cuda/backend.py``'s do;
* ``kernel_arguments_on_device()``: the ops the CUDA backend serves with kernels
  (``KERNEL_OPS``) refuse host array arguments, as a kernel launch does, where their
  reference (advanced indexing) would take them; in a captured step they run with the
  capture's refusals lifted (a kernel reads nothing back, whatever its reference does here:
  that the kernels are captured is the GPU tests' to show);
* ``strict_cuda()``: the backend with both, and with ``refusing_implicit_copies``.

Not emulated: the CUDA backend's own kernels (the op catalogue's ``nvrtc`` providers,
``ops/*/nvrtc.py``, ``backends/cuda``) are not run, their ``reference`` rows serve; of a
kernel's arguments only host arrays are refused, not dtypes, layouts or contiguity; streams,
synchronisation, and a captured graph's replay (a "captured" step runs again each call, under
``capturing``'s refusals); the device sampler (the host samples, as with no sampler).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ninfer_runtime import backends
from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.ops import registry
from ninfer_runtime.ops.registry import override
from tests.strict_device import (
    DeviceArray,
    capturing,
    launching_a_kernel,
    refuse_host_arrays,
    refusing_implicit_copies,
    xp,
)

__all__ = ["KERNEL_OPS", "StrictCudaBackend", "kernel_arguments_on_device", "strict_cuda"]

#: (family, op) -> positions of the array arguments its CUDA kernel copies to the device itself
#: (``ops/delta_rule/nvrtc.py``: ``commit``'s slots and counts); every other array argument of
#: these ops is a kernel's launch argument on CUDA (``ops/<family>/nvrtc.py``), refused there
#: as a host array even where the reference (advanced indexing) would take one
KERNEL_OPS: dict[tuple[str, str], tuple[int, ...]] = {
    **{("attention", op): () for op in ("prefill", "write", "decode")},
    **{("delta_rule", op): () for op in ("chunk", "prefill", "decode", "verify")},
    ("delta_rule", "commit"): (3, 5),
    **{("norm", op): () for op in ("rms_norm", "add_rms_norm", "gated_rms_norm")},
    ("moe", "block"): (),
    ("moe", "routed_experts"): (),
    ("norm", "sinkhorn"): (),
    ("sampling", "score"): (),
}


@contextlib.contextmanager
def kernel_arguments_on_device() -> Iterator[None]:
    """Within the block the ops of ``KERNEL_OPS`` resolved for ``cuda`` refuse host arrays,
    as their kernels would. The registry memoises resolutions: the one it walks
    (``registry._resolve``) is wrapped, the memo forgotten on entry and on exit."""
    resolve = registry._resolve

    def checked(family: str, op: str, key: dict[str, Any]) -> Any:
        fn = resolve(family, op, key)
        copied = KERNEL_OPS.get((family, op))
        if key.get("device") != "cuda" or copied is None:
            return fn

        def kernel_op(*args: Any, **kwargs: Any) -> Any:
            launched = [a for i, a in enumerate(args) if i not in copied]
            refuse_host_arrays(f"kernel {family}.{op}", (launched, kwargs))
            with launching_a_kernel():
                return fn(*args, **kwargs)

        return kernel_op

    registry._resolve = checked
    registry._forget()
    try:
        yield
    finally:
        registry._resolve = resolve
        registry._forget()


class StrictCudaBackend(CpuBackend):
    """The CPU backend under the CUDA backend's name on the strict module: weights and every
    array it returns are device arrays, and its methods refuse host activations where
    ``backends/cuda/backend.py``'s do (its numpy code dispatches to the strict functions);
    ``embedding`` takes host ids, as the CUDA backend's ``cp.asarray(ids)`` does. The name
    makes the op policies pick their ``cuda`` rows (the reference providers, the kernels'
    libraries being absent; ``strict_cuda`` forces the moe block's reference, whose only
    ``cuda`` row is a kernel). Decode steps run eagerly, products in float32."""

    name = "cuda"
    xp = xp
    #: decode steps are "captured" as the CUDA backend's are: from their second call on they
    #: run under ``capturing`` (no copy from the host, no read back), unless a model said its
    #: steps read the host (``decode_eagerly``) or a step is not to be captured
    graphs = True
    prefill_precision = "float32"

    def compile_step(self, fn: Any, shapes: Any, capture: bool = True) -> Any:
        eager = super().compile_step(fn, shapes, capture)
        if not (self.graphs and capture):
            return eager
        calls = {"n": 0}

        def step(*host: Any) -> Any:
            inputs = [xp.asarray(a) for a in host]  # copied in before the graph launches
            calls["n"] += 1
            if calls["n"] == 1:  # the first call runs eagerly, as GraphStep's does
                out = fn(*inputs)
            else:
                with capturing():
                    out = fn(*inputs)
            return () if out is None else out

        return step

    def prepare(self, artifact: Any, names: Iterable[str]) -> dict[str, Any]:
        weights = super().prepare(artifact, names)
        return {name: w.view(DeviceArray) for name, w in weights.items()}

    def embedding(self, ids: Any, table: Any) -> Any:
        return table[xp.asarray(ids).astype(np.int64)]


@contextlib.contextmanager
def strict_cuda() -> Iterator[StrictCudaBackend]:
    """A ``StrictCudaBackend`` with implicit device->host copies refused, host arrays refused
    as kernels' arguments, and the moe block's ``cuda`` row served by its reference; meanwhile
    it is the ``cuda`` backend an engine creates, by its factory and its class (so settings
    the engine reads from the class before it creates a backend, ``kv_dtype`` auto among
    them, are this backend's: float32 K/V, as the CPU engine it is compared with)."""
    backend = StrictCudaBackend()
    saved = backends._FACTORIES["cuda"], backends._CLASSES["cuda"]
    backends._FACTORIES["cuda"] = lambda: backend
    backends._CLASSES["cuda"] = lambda: StrictCudaBackend
    moe_reference = override("moe", "block", "reference")
    try:
        with kernel_arguments_on_device(), moe_reference, refusing_implicit_copies():
            yield backend
    finally:
        backends._FACTORIES["cuda"], backends._CLASSES["cuda"] = saved
