"""Products of activations with packed (quantized) weights, and of two arrays.

Op ``product``: ``(data, p, row0, rows, x, y, ldy) -> None``: ``y[m, r] = Σ_k x[m, k]
W[row0 + r, k]`` for ``M = x.shape[0] <= 64`` activation rows (decode steps, speculative
verifications, short prompt tails), ``data`` the object's bytes and ``p`` its planes
(``backends.cuda.formats.Planes``), x float32 ``p.x_width`` wide, y a float32 view whose rows
are ``ldy`` apart. More rows are a prefill: the backend dequantizes slabs to bf16 and
multiplies with cuBLAS (``backends/cuda/prefill.py``), not yet an op here.

Op ``product_bf16``: the same at the production precision: a provider may round x once to
bf16 (or fp16 where its fragments are fp16, each row scaled into range) with float32
accumulation. ``tiles`` and ``tensor_cores`` do (half the mma work of ``product``, which
carries x as two halves); ``gemv`` (float32 x on the SIMT cores) serves it as ``product``.

Op ``matmul``: ``(a, b) -> a @ b``, numpy's ``matmul`` of two arrays ([..., M, K] and
[..., K, N], up to two batch axes broadcast, float32): the products between activations
(and small weight arrays) of the models' math, which callers reach through ``matmul`` here
(the device and, on a GPU, whether a CUDA graph is being captured are its key). Providers:
``reference`` (the array's module: numpy, or cuBLAS through CuPy) and ``nvrtc`` (ours,
``backends/cuda/matmul.py``: capturable).

Providers of ``product``: ``reference`` (``reference.py``, the oracle: the object decoded by
its format's codec, multiplied in float32 on the host; the CPU device's row) and, in
``nvrtc.py``, our kernels: ``tiles`` (tile-packed objects, eight rows a launch),
``tensor_cores`` (the small-M tensor-core kernel of row_split q4..q8, NVFP4, bf16 and the
K-quant layouts) and ``gemv`` (the SIMT GEMV, every stored layout, eight rows a launch).
``policy.py`` orders them by format, activation rows and weight size (the measured crossover
``TENSOR_CORES_FROM``); the resolution key is the device, the format code, whether the object
is tile packed or has a tensor-core kernel, M and the product's weights (rows x columns).
"""

from typing import Any

import numpy as np

from ...arrays import array_module
from ..registry import Provider, family, providers, register, resolve
from .policy import OPS, choose

__all__ = ["matmul", "product_key", "served_by"]


def matmul(a: Any, b: Any) -> Any:
    """``a @ b`` of two arrays on their own device, by the policy's provider: on a GPU inside
    a CUDA graph capture only a kernel the capture can record serves."""
    xp = array_module(a)
    if xp is np:
        return resolve("linear", "matmul", device="cpu", capturing=False)(a, b)
    capturing = bool(xp.cuda.get_current_stream().is_capturing())
    return resolve("linear", "matmul", device="cuda", capturing=capturing)(a, b)


def product_key(p: Any, rows: int, m: int, device: str = "cuda") -> dict[str, Any]:
    """The resolution key of a ``product`` of ``m`` activation rows with ``rows`` rows of the
    object whose planes are ``p``, on ``device``."""
    from ...backends.cuda.kernels import has_tensor_cores

    return {
        "device": device,
        "code": p.code,
        "tiled": p.tiled,
        "tensor_cores": has_tensor_cores(p),
        "m": m,
        "weights": rows * p.columns,
    }


def served_by(key: dict[str, Any]) -> str:
    """The provider the policy picks for ``key``, installed or not (plain Python: the tests
    check the table without a GPU)."""
    table = providers("linear")["product"]
    return next(name for name in choose("product", **key) if table[name].takes(key))


family("linear", choose)
#: (op, provider) -> (module, function, its accepts function, libraries it needs)
_PROVIDERS = {
    **{(op, "reference"): ("reference", "product", "accepts", ()) for op in OPS},
    **{
        (op, name): ("nvrtc", name, f"accepts_{name}", ("cupy",))
        for op in OPS
        for name in ("tiles", "tensor_cores", "gemv")
    },
    ("product_bf16", "tiles"): ("nvrtc", "tiles_bf16", "accepts_tiles", ("cupy",)),
    ("product_bf16", "tensor_cores"): (
        "nvrtc", "tensor_cores_bf16", "accepts_tensor_cores", ("cupy",),
    ),
    ("matmul", "reference"): ("reference", "matmul", "", ()),
    ("matmul", "nvrtc"): ("nvrtc", "matmul", "", ("cupy",)),
}  # fmt: skip
for (_op, _name), (_module, _function, _accepts, _requires) in _PROVIDERS.items():
    register(
        Provider(
            family="linear",
            op=_op,
            name=_name,
            module=f"{__name__}.{_module}",
            function=_function,
            requires=_requires,
            accepts=_accepts,
        )
    )
