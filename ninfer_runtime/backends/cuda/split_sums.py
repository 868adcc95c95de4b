"""What the K-split products share: the float32 partial sums and per-block arrival counters
(one set per process: products on a device run one after another, and each launch leaves its
counters at zero), and how many blocks of a kernel the device holds at once."""

from __future__ import annotations

from typing import Any

from .compile import sm_count

#: float32 partial sums a K-split launch may leave (split * M * rows must fit)
PARTIAL_FLOATS = 4 << 20
#: arrival counters: blocks a K-split launch may have along its rows
COUNTERS = 1 << 16
#: CUfunction_attribute CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES and _NUM_REGS (cuda.h)
_SHARED_SIZE_BYTES, _NUM_REGS = 1, 4
_BUFFERS: list[Any] = []


def buffers() -> tuple[Any, Any]:
    """The partial-sum buffer and the counters (made on first use)."""
    if not _BUFFERS:
        import cupy as cp

        _BUFFERS.extend(
            (cp.empty(PARTIAL_FLOATS, dtype=cp.float32), cp.zeros(COUNTERS, dtype=cp.uint32))
        )
    return _BUFFERS[0], _BUFFERS[1]


def blocks_per_sm(fn: Any, threads: int) -> int:
    """Blocks of ``fn`` (``threads`` threads each) one multiprocessor holds, as its registers
    allow (allocated per warp in units of 256): what limits these kernels."""
    import cupy as cp

    regs = -(-cp.cuda.driver.funcGetAttribute(_NUM_REGS, fn.ptr) // 8) * 8
    return max(1, min(32, 65536 // (regs * threads)))


def static_shared(fn: Any) -> int:
    """Bytes of statically allocated shared memory a block of ``fn`` takes."""
    import cupy as cp

    return int(cp.cuda.driver.funcGetAttribute(_SHARED_SIZE_BYTES, fn.ptr))


def resident_blocks(fn: Any, threads: int) -> int:
    """Blocks of ``fn`` the whole device holds at once."""
    return sm_count() * blocks_per_sm(fn, threads)
