"""Compile every CUDA kernel family into the kernel cache, one process per family.

NVRTC compiles one translation unit on one core; building the families side by side turns
the first start on a fresh machine from minutes into the time of the largest family.
``NINFER_KERNEL_CACHE`` chooses the cache directory. Needs CuPy and a device.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _families() -> dict[str, list[str]]:
    import ninfer_runtime.backends.cuda as package
    from ninfer_runtime.backends.cuda import compile as C

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")
    return C.FAMILIES


def _build(family: str) -> tuple[str, float]:
    from ninfer_runtime.backends.cuda import compile as C

    start = time.perf_counter()
    C.Module(family, _families()[family])
    return family, time.perf_counter() - start


def main() -> int:
    from cupy_backends.cuda.libs import nvrtc

    # a cache seeded elsewhere (scripts/check_kernels.py --cache) hits only for this version
    print("NVRTC", ".".join(str(v) for v in nvrtc.getVersion()))
    families = sorted(_families())
    with ProcessPoolExecutor(min(len(families), 16)) as pool:
        for family, seconds in pool.map(_build, families):
            print(f"{family}: {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
