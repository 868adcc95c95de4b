"""Small read-only device arrays that depend only on host integers (a slab's row indices,
the shared expert's group layout for a row count), made once and kept: making them on the
device at every call costs a launch or more of host time each, and a prefill chunk of a
large model is bound by the host issuing its work.

``build`` makes the array with device operations (no copy from host memory, which a stream
capture would refuse); one first asked for while the stream is being captured into a CUDA
graph is not kept: its contents would only exist when the graph replays.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["device_constant"]

_KEPT: dict[Hashable, Any] = {}


def device_constant(key: Hashable, build: Callable[[], Any]) -> Any:
    """``build()`` (a device array), kept under ``key``; the caller must never write to it."""
    import cupy as cp

    kept = _KEPT.get(key)
    if kept is not None:
        return kept
    array = build()
    if not cp.cuda.get_current_stream().is_capturing():
        _KEPT[key] = array
    return array
