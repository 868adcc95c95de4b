"""Which numpy-like module an array belongs to, without importing any GPU library."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import numpy as np


def array_module(x: Any) -> ModuleType:
    """``numpy`` for numpy arrays, ``cupy`` for CuPy arrays (numpy 2 and array-API arrays
    name it through ``__array_namespace__``)."""
    namespace = getattr(x, "__array_namespace__", None)
    if namespace is not None:
        return namespace()
    # CuPy 14 arrays have no __array_namespace__ yet; their module is the namespace.
    return importlib.import_module(type(x).__module__.split(".")[0])


def sync(xp: ModuleType) -> None:
    """Wait for the work queued on ``xp``'s device (CuPy's; nothing to wait for on numpy)."""
    if hasattr(xp, "cuda"):
        xp.cuda.Device().synchronize()


def host_copy(x: Any) -> Any:
    """A host (numpy) copy of ``x``; of a CuPy array, in pinned memory (the copy back to the
    device runs at full bus speed)."""
    if isinstance(x, np.ndarray):
        return x.copy()
    cupyx = importlib.import_module("cupyx")
    out = cupyx.empty_pinned(x.shape, x.dtype)
    x.get(out=out)
    return out
