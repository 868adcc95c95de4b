"""THE table of the linear family: which small-M product serves M activation rows of a packed
object. A tile-packed object is read only by the tile kernel. Otherwise the tensor-core kernel
costs a few microseconds more per call (an x-fragment pass, the K-split sum) and barely slows
down with M, while the GEMV's time grows with M (more slowly for q8 and bf16, which it decodes
cheaply): ``TENSOR_CORES_FROM`` holds, per layout, the (fewest activation rows, fewest
weights) from which the tensor cores win, measured on the H200 with
``benchmarks/gpu_bench.py --rows 1,2,4,8 --shapes ...`` (docs/performance.md, "Choosing the
small-M kernel"). Beyond the GEMV's 8 rows the tensor cores win wherever they read the
layout. On the CPU device the reference serves (the CPU backend itself multiplies weights it
decoded once at load; the reference is the oracle the kernels' tests compare with)."""

from __future__ import annotations

from collections.abc import Sequence

from ...backends.cuda import formats as F

#: rows the SIMT GEMV takes in one launch
MAX_GEMV_ROWS = 8
_GGUF_Q4_K, _GGUF_Q5_K, _GGUF_Q6_K = (F.GGUF_CODES[f"gguf_q{b}_k"] for b in (4, 5, 6))
#: format code -> ((fewest activation rows M, fewest weights rows x K), ...): the tensor-core
#: kernel is first from any of these on; one row runs the GEMV except for large NVFP4 objects,
#: whose E2M1 decode costs the GEMV most
TENSOR_CORES_FROM: dict[int, tuple[tuple[int, int], ...]] = {
    F.Q4: ((2, 30_000_000), (4, 4_000_000)),
    F.Q5: ((2, 40_000_000), (4, 4_000_000)),
    F.Q6: ((2, 30_000_000), (4, 4_000_000)),
    F.Q8: ((5, 16_000_000),),
    F.NVFP4: ((1, 80_000_000), (2, 4_000_000)),
    F.BF16: ((4, 32_000_000), (8, 16_000_000)),
    # the GGUF SIMT GEMV reads x again for every row at M > 1 (not yet measured against
    # each other at M = 1)
    _GGUF_Q4_K: ((2, 0),),
    _GGUF_Q5_K: ((2, 0),),
    _GGUF_Q6_K: ((2, 0),),
}


#: the small-M products: x as the kernel carries it (``product``: the split precision where
#: a kernel has one), or rounded once (``product_bf16``, the production precision)
OPS = ("product", "product_bf16")

#: (device, capturing) -> the providers of ``matmul``, the product of two arrays: the
#: reference's ``xp.matmul`` (cuBLAS on a device) wherever it can run; inside a CUDA graph
#: capture, which a library's product cannot join, ours (one launch; its speed against
#: cuBLAS not yet measured), the reference only where ours is not installed
MATMUL: dict[tuple[str, bool], tuple[str, ...]] = {
    ("cpu", False): ("reference",),
    ("cuda", False): ("reference", "nvrtc"),
    ("cuda", True): ("nvrtc", "reference"),
}


def tensor_cores_first(code: int, m: int, weights: int) -> bool:
    """Whether the tensor-core kernel beats the GEMV for M rows of ``weights`` weights of a
    layout it reads."""
    if m > MAX_GEMV_ROWS:
        return True
    return any(m >= m_min and weights >= w_min for m_min, w_min in TENSOR_CORES_FROM.get(code, ()))


def choose(
    op: str,
    *,
    device: str,
    code: int = 0,
    m: int = 0,
    weights: int = 0,
    capturing: bool = False,
    **_: object,
) -> Sequence[str]:
    if op == "matmul" and (device, capturing) in MATMUL:
        return MATMUL[(device, capturing)]
    if op in OPS and device == "cpu":  # the oracle, on host arrays
        return ("reference",)
    if op not in OPS or device != "cuda":
        raise LookupError(f"linear: no policy row for {op!r} on {device!r}")
    if tensor_cores_first(code, m, weights):
        return ("tiles", "tensor_cores", "gemv")
    return ("tiles", "gemv", "tensor_cores")
