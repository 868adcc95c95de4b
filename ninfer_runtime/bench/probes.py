"""What the device can do, measured in the same run as the rates: the copy bandwidth a decode
step's floor is taken at, the matmul rate a prefill's is; and the drained timing both use.
With expert offload also the host's: the rate its cores read memory (the floor of the host's
expert products) and the rate host memory copies to the device (the floor of streaming).

Each device probe hands its buffers back to the device when it is done (CuPy's pool would
otherwise keep the copy probe's 4 GiB as free blocks, which the engine's memory figures would
then count)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..arrays import sync

#: bytes of the buffer the copy-bandwidth probe copies: well beyond the GPU's 50 MB L2, and
#: beyond a CPU's last-level cache (a 2 GiB copy on the CPU took most of a tiny CPU run)
COPY_BYTES = 2 << 30
CPU_COPY_BYTES = 128 << 20


def median_seconds(xp: Any, fn: Any, repeats: int = 5) -> float:
    """Median wall time of ``fn()`` with the device drained around it, after one warm-up."""
    times = []
    for _ in range(repeats + 1):
        sync(xp)
        start = time.perf_counter()
        fn()
        sync(xp)
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:]))


def release(xp: Any) -> None:
    """Return the device pool's free blocks to the device (a probe's buffers, once dropped)."""
    pool = getattr(xp, "get_default_memory_pool", None)
    if pool is not None:
        pool().free_all_blocks()


def copy_bandwidth(xp: Any) -> float:
    """Bytes per second read plus written by a large device-to-device copy."""
    size = COPY_BYTES if hasattr(xp, "cuda") else CPU_COPY_BYTES
    seconds = _copy_seconds(xp, size)
    release(xp)  # the buffers went with the call above
    return 2 * size / seconds


def _copy_seconds(xp: Any, size: int) -> float:
    src = xp.ones(size // 4, dtype=xp.float32)
    dst = xp.empty_like(src)

    def copy() -> None:
        dst[...] = src

    return median_seconds(xp, copy)


def matmul_rate(xp: Any) -> float:
    """FLOP/s of a large float16 product on the GPU (tensor cores), float32 on the CPU."""
    gpu = hasattr(xp, "cuda")
    n, dtype = (8192, xp.float16) if gpu else (1024, xp.float32)
    seconds = _matmul_seconds(xp, n, dtype)
    release(xp)
    return 2 * n**3 / seconds


def _matmul_seconds(xp: Any, n: int, dtype: Any) -> float:
    a = xp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype=dtype)
    return median_seconds(xp, lambda: a @ a)


#: bytes the host's read probe reads: beyond the last-level caches
HOST_READ_BYTES = 1 << 30
#: bytes the upload probe copies from pinned host memory to the device
UPLOAD_BYTES = 256 << 20


def host_read_bandwidth(threads: int, nbytes: int = HOST_READ_BYTES, repeats: int = 5) -> float:
    """Bytes a second the host's cores read: one large array's maximum taken in ``threads``
    slices side by side (numpy's reductions release the GIL), the best of ``repeats``."""
    data = np.ones(nbytes // 8, dtype=np.float64)
    slices = np.array_split(data, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(np.max, slices))
            best = min(best, time.perf_counter() - start)
    return nbytes / best


def upload_bandwidth(xp: Any) -> float | None:
    """Bytes a second a copy from pinned host memory to the GPU moves (None without a GPU:
    the CPU backend's device is host memory)."""
    if not hasattr(xp, "cuda"):
        return None
    import cupyx

    host = cupyx.empty_pinned((UPLOAD_BYTES,), dtype=np.uint8)
    host[...] = 1
    seconds = _upload_seconds(xp, host)
    release(xp)
    return UPLOAD_BYTES / seconds


def _upload_seconds(xp: Any, host: Any) -> float:
    device = xp.empty(host.size, dtype=xp.uint8)
    return median_seconds(xp, lambda: device.set(host))
