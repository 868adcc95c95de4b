"""The most bytes a CuPy pool had in use during part of a run.

CuPy's pool keeps freed blocks for reuse and records no peak: its held bytes are a
high-water mark of use plus whatever its size classes could not reuse, so a run that frees
and allocates blocks of many sizes holds more than it ever used at once. ``PeakInUse`` puts
itself between the pool and its callers (``cupy.cuda.set_allocator``) and reads the pool's
bytes in use after each allocation, which is where the peak can only rise. It costs a
Python call an allocation, so a bench installs it only where the measurement needs it.
"""

from __future__ import annotations

from typing import Any


class PeakInUse:
    """The pool of ``xp`` (CuPy) watched from ``install`` until ``stop``."""

    def __init__(self, xp: Any):
        self.xp = xp
        self.pool = xp.get_default_memory_pool()
        self.peak = int(self.pool.used_bytes())

    @classmethod
    def install(cls, xp: Any) -> PeakInUse | None:
        """Start watching ``xp``'s default pool (None for an array module without one)."""
        if not hasattr(xp, "get_default_memory_pool"):
            return None
        watch = cls(xp)
        xp.cuda.set_allocator(watch.malloc)
        return watch

    def malloc(self, size: int) -> Any:
        memory = self.pool.malloc(size)
        used = int(self.pool.used_bytes())
        if used > self.peak:
            self.peak = used
        return memory

    def stop(self) -> int:
        """Hand allocation back to the pool itself; the peak seen."""
        self.xp.cuda.set_allocator(self.pool.malloc)
        return self.peak
