"""Launch one small-M product repeatedly, for a kernel profiler to look at.

    ncu --set full -k regex:gemv -s 5 -c 1 python benchmarks/profile_product.py \\
        q4_g64_fp16 5120x17408 1 simt

KIND is ``simt`` (the SIMT GEMV), ``tc`` (the tensor-core kernel), ``tiles`` (the tile kernel
on a tile-packed copy) or ``product`` (what the backend picks for the stored layout). The
weights are random valid bytes (``gpu_bench.random_object``).
"""

from __future__ import annotations

import sys

import cupy as cp
from gpu_bench import LAYOUTS, random_object

from ninfer_runtime.backends.cuda import kernels, tile_products, tiles
from ninfer_runtime.ops import registry
from ninfer_runtime.ops.linear import product_key


def chosen(data, p, row0, rows, x, y, ldy) -> None:
    """The linear family's ``product`` as the backend resolves it for this object."""
    product = registry.resolve("linear", "product", **product_key(p, rows, int(x.shape[0])))
    product(data, p, row0, rows, x, y, ldy)


KINDS = {
    "simt": kernels.gemv,
    "tc": kernels.small_gemm,
    "product": chosen,
    "tiles": tile_products.product,
}


def main() -> None:
    fmt, shape_text, m_text, kind = sys.argv[1:5]
    shape = tuple(int(v) for v in shape_text.split("x"))
    data, p = random_object(fmt, dict(LAYOUTS)[fmt], shape)
    if kind == "tiles":
        data = tiles.pack_tiles(cp, data, p.code, *shape)
        p = tiles.tiled_planes(p.code, *shape)
    x = cp.random.standard_normal((int(m_text), p.x_width), dtype=cp.float32)
    y = cp.empty((x.shape[0], shape[0]), dtype=cp.float32)
    for _ in range(10):
        KINDS[kind](data, p, 0, shape[0], x, y, shape[0])
    cp.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
