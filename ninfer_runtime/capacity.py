"""The context pool's byte budget as configured: sizes as people write them (``24GiB``,
``16G``, ``512 MiB``, ``auto``) parsed, and ``auto`` resolved against the backend's memory."""

from __future__ import annotations

from typing import Any

from .errors import EngineError

_UNITS = {"": 1, "B": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4}
_UNITS.update({f"{u}B": v for u, v in list(_UNITS.items()) if u not in ("", "B")})
_UNITS.update({f"{u}IB": 1024 ** "KMGT".index(u) * 1024 for u in "KMGT"})


def parse_capacity(text: str | int | None) -> int | str | None:
    """``auto``, a byte count, or a size with a unit (``24GiB``, ``16G``, ``512 MiB``)."""
    if isinstance(text, str) and text.strip().lower() == "auto":
        return "auto"
    size = _parse_size(text, "context capacity", "'auto' or a size such as 24GiB, 16G, 512MiB")
    if size is not None and size <= 0:
        raise EngineError(f"context capacity {text!r} must be positive")
    return size


def parse_size(text: str | int | None, what: str = "memory headroom") -> int | None:
    """A byte count, or a size with a unit (``4GiB``), zero or more; ``None`` stays ``None``."""
    return _parse_size(text, what, "a size such as 4GiB, 512MiB or a byte count")


def _parse_size(text: str | int | None, what: str, expected: str) -> int | None:
    if text is None or isinstance(text, int):
        if text is not None and text < 0:
            raise EngineError(f"{what} {text!r} must not be negative")
        return text
    value = text.strip().upper().replace(" ", "")
    number = value.rstrip("KMGTIB")
    unit = value[len(number) :]
    try:
        size = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise EngineError(f"{what} {text!r}: expected {expected}") from None
    if size < 0:
        raise EngineError(f"{what} {text!r} must not be negative")
    return int(size)


def budget_bytes(
    capacity: int | str | None, backend: Any, headroom: int | None = None
) -> int | None:
    """The context pool's byte budget: ``capacity`` as given (``None``: no limit), or for
    ``"auto"`` what the backend has free after weights and workspace, less ``headroom``
    (``None``: the backend's default; the result is ``None`` when it has no memory limit)."""
    if capacity == "auto":
        return backend.context_budget(headroom)
    return None if capacity is None else int(capacity)
