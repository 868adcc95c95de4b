"""Backends by name: ``cpu`` (numpy float32 reference); ``cuda`` registers itself later.

A registry instead of an if-chain so a new backend is an addition: it calls
``register_backend`` at import and users select it by the name they type.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..errors import EngineError
from .base import Array, Backend, ExpertWeights, MoeWeights, Weight

_FACTORIES: dict[str, Callable[[], Backend]] = {}
#: each name's backend class, or a class with its attributes, imported without creating the
#: backend (None: not known here), so its class attributes (``max_lanes``, ``kv_dtype``) are
#: known before a load
_CLASSES: dict[str, Callable[[], type | None]] = {}

log = logging.getLogger("ninfer.backends")


def register_backend(
    name: str, factory: Callable[[], Backend], kind: Callable[[], type | None] | None = None
) -> None:
    """Make ``factory`` available as ``get_backend(name)`` and ``kind`` (its class, imported)
    as ``backend_class(name)``."""
    _FACTORIES[name] = factory
    if kind is not None:
        _CLASSES[name] = kind


def backend_class(backend: str | Backend) -> type | None:
    """The class of ``backend``: an instance's own, or for a name the class (or the cupy-free
    base holding its attributes) ``get_backend`` would create, without creating it (None:
    unknown here)."""
    if not isinstance(backend, str):
        return type(backend)
    kind = _CLASSES.get(backend)
    return None if kind is None else kind()


def available_backends() -> list[str]:
    return sorted(_FACTORIES)


def get_backend(name: str | Backend) -> Backend:
    """A backend instance by name; an instance passes through (tests inject their own)."""
    if not isinstance(name, str):
        return name
    factory = _FACTORIES.get(name)
    if factory is None:
        raise EngineError(f"no backend {name!r}; known: {', '.join(available_backends())}")
    return factory()


def _cpu() -> Backend:
    from .cpu import CpuBackend

    return CpuBackend()


def _cpu_class() -> type:
    from .cpu import CpuBackend

    return CpuBackend


def _cuda_class() -> type:
    from .cuda.traits import CudaTraits  # the attributes, without importing CuPy

    return CudaTraits


def _cuda() -> Backend:
    from .cuda import create_backend  # imports CuPy only when the backend is selected

    return create_backend()


def decode_eagerly(backend: Backend, why: str) -> None:
    """Decode steps that read the host (``why``) can't be captured: a backend capturing them
    as CUDA graphs (``backend.graphs``) runs them eagerly from now on; others already do."""
    if getattr(backend, "graphs", False):
        log.info("decode steps run eagerly, without CUDA graphs: %s", why)
        backend.graphs = False  # type: ignore[attr-defined]


register_backend("cpu", _cpu, _cpu_class)
register_backend("cuda", _cuda, _cuda_class)

__all__ = [
    "Array",
    "Backend",
    "ExpertWeights",
    "MoeWeights",
    "Weight",
    "available_backends",
    "backend_class",
    "decode_eagerly",
    "get_backend",
    "register_backend",
]
