"""How many lanes (sequences decoded together) an engine may run.

``MAX_LANES`` is the product's ceiling, the one bound every layer shares; below it each backend
states the most its kernels run as the class attribute ``max_lanes`` (the CPU and CUDA
backends the ceiling: the CUDA sampler, small-M products and MoE decode take up to 64 rows).
Every backend runs ``COMMON_LANES`` (a backend that states none runs that many).
"""

from __future__ import annotations

from typing import Any

from .backends import backend_class
from .errors import EngineError

__all__ = [
    "COMMON_LANES",
    "MAX_LANES",
    "backend_label",
    "backend_max_lanes",
    "check_max_lanes",
]

#: the most lanes any engine runs, on any backend
MAX_LANES = 64
#: the lanes every backend runs, and those of a backend that does not state ``max_lanes``
COMMON_LANES = 8


def backend_max_lanes(backend: str | Any) -> int:
    """The most lanes ``backend`` (a name or an instance) runs, within ``MAX_LANES``; known
    without creating the backend, so a setting it cannot run is refused before a load."""
    return min(getattr(backend_class(backend), "max_lanes", COMMON_LANES), MAX_LANES)


def backend_label(backend: str | Any) -> str:
    """The backend's name for a message."""
    return backend if isinstance(backend, str) else getattr(backend, "name", type(backend).__name__)


def check_max_lanes(max_lanes: int, backend: str | Any) -> None:
    """Refuse ``max_lanes`` below 1 or above the backend's most (one line naming both)."""
    if max_lanes < 1:
        raise EngineError(f"max_lanes {max_lanes}: an engine runs at least 1 lane")
    most = backend_max_lanes(backend)
    if max_lanes > most:
        raise EngineError(
            f"max_lanes {max_lanes}: the {backend_label(backend)} backend runs at most {most} lanes"
        )
