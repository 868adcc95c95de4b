"""The CUDA backend (``get_backend("cuda")``): CuPy plus our own kernels.

Importing this package needs nothing beyond the CPU install; CuPy and a device are checked
only when the backend is created, so ``ninfer`` works on machines without a GPU.
"""

from __future__ import annotations

from typing import Any

from ...errors import EngineError

NEEDS = "the cuda backend needs CuPy (pip install ninfer[gpu]) and an NVIDIA GPU"


def unavailable_reason() -> str | None:
    """Why the backend cannot run here (None when it can)."""
    try:
        import cupy
    except ImportError:
        return NEEDS
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError when there is no driver
        return f"{NEEDS} ({exc})"
    return None if count > 0 else f"{NEEDS} (no device found)"


#: the small-M (decode) products' precision (``backend.DECODE_PRODUCTS``)
DECODE_ENV = "NINFER_CUDA_DECODE"


def create_backend() -> Any:
    reason = unavailable_reason()
    if reason is not None:
        raise EngineError(reason)
    import os

    from .backend import DECODE_PRODUCTS, CudaBackend
    from .env import env_choice
    from .prefill import precision_from_env

    # NINFER_CUDA_GRAPHS=0 runs decode steps eagerly; NINFER_CUDA_PREFILL=bf16|tf32|float32
    # picks the prefill products' precision (bf16 tensor cores by default; float32 for
    # debugging and token-for-token comparison with the CPU reference);
    # NINFER_CUDA_DECODE=bf16|split the small-M products' (bf16, the production precision,
    # by default; split for token-for-token comparison with the CPU reference);
    # NINFER_CUDA_HOST_NODES=1 lets expert offload's host share be host nodes of captured
    # steps (off by default: where the host computes its experts at all, --expert-stream-decode
    # off; by default the device reads them in place)
    try:
        decode = env_choice(DECODE_ENV, tuple(DECODE_PRODUCTS), "bf16")
        prefill = precision_from_env()
    except ValueError as exc:  # the variable and what it takes, in one line
        raise EngineError(str(exc)) from None
    return CudaBackend(
        graphs=os.environ.get("NINFER_CUDA_GRAPHS", "1") != "0",
        host_nodes=os.environ.get("NINFER_CUDA_HOST_NODES", "0") == "1",
        prefill_precision=prefill,
        decode_precision=decode,
    )


__all__ = ["NEEDS", "create_backend", "unavailable_reason"]
