"""What the device can do, measured in the same run as the rates: the copy bandwidth a decode
step's floor is taken at, the matmul rate a prefill's is; and the drained timing both use."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

#: bytes of the buffer the copy-bandwidth probe copies: well beyond the GPU's 50 MB L2, and
#: beyond a CPU's last-level cache (a 2 GiB copy on the CPU took most of a tiny CPU run)
COPY_BYTES = 2 << 30
CPU_COPY_BYTES = 128 << 20


def sync(xp: Any) -> None:
    if hasattr(xp, "cuda"):
        xp.cuda.Device().synchronize()


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


def copy_bandwidth(xp: Any) -> float:
    """Bytes per second read plus written by a large device-to-device copy."""
    size = COPY_BYTES if hasattr(xp, "cuda") else CPU_COPY_BYTES
    src = xp.ones(size // 4, dtype=xp.float32)
    dst = xp.empty_like(src)

    def copy() -> None:
        dst[...] = src

    return 2 * size / median_seconds(xp, copy)


def matmul_rate(xp: Any) -> float:
    """FLOP/s of a large float16 product on the GPU (tensor cores), float32 on the CPU."""
    gpu = hasattr(xp, "cuda")
    n, dtype = (8192, xp.float16) if gpu else (1024, xp.float32)
    a = xp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype=dtype)
    return 2 * n**3 / median_seconds(xp, lambda: a @ a)
