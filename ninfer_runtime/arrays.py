"""Which numpy-like module an array belongs to, without importing any GPU library."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


def array_module(x: Any) -> ModuleType:
    """``numpy`` for numpy arrays, ``cupy`` for CuPy arrays (numpy 2 and array-API arrays
    name it through ``__array_namespace__``)."""
    namespace = getattr(x, "__array_namespace__", None)
    if namespace is not None:
        return namespace()
    # CuPy 14 arrays have no __array_namespace__ yet; their module is the namespace.
    return importlib.import_module(type(x).__module__.split(".")[0])
