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

log = logging.getLogger("ninfer.backends")


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    """Make ``factory`` available as ``get_backend(name)``."""
    _FACTORIES[name] = factory


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


def _cuda() -> Backend:
    from .cuda import create_backend  # imports CuPy only when the backend is selected

    return create_backend()


def decode_eagerly(backend: Backend, why: str) -> None:
    """Decode steps that read the host (``why``) can't be captured: a backend capturing them
    as CUDA graphs (``backend.graphs``) runs them eagerly from now on; others already do."""
    if getattr(backend, "graphs", False):
        log.info("decode steps run eagerly, without CUDA graphs: %s", why)
        backend.graphs = False  # type: ignore[attr-defined]


register_backend("cpu", _cpu)
register_backend("cuda", _cuda)

__all__ = [
    "Array",
    "Backend",
    "ExpertWeights",
    "MoeWeights",
    "Weight",
    "available_backends",
    "decode_eagerly",
    "get_backend",
    "register_backend",
]
