"""Our small-M product kernels as linear providers (launchers in ``backends/cuda/kernels.py``,
the tensor-core kernel; ``gemv.py``, the SIMT GEMV, which ``kernels`` re-exports; and
``tile_products.py``). Each takes any M <= 64: the eight-row kernels run in launches of eight
rows. ``matmul``, the product of two arrays: ``backends/cuda/matmul.py``."""

from __future__ import annotations

from typing import Any

from ...backends.cuda import kernels, tile_products
from ...backends.cuda.matmul import matmul
from .policy import MAX_GEMV_ROWS

__all__ = [
    "accepts_gemv",
    "accepts_tensor_cores",
    "accepts_tiles",
    "gemv",
    "matmul",
    "tensor_cores",
    "tensor_cores_bf16",
    "tiles",
    "tiles_bf16",
]


def accepts_tiles(*, tiled: bool, **_: object) -> bool:
    return tiled


def accepts_tensor_cores(*, tiled: bool, tensor_cores: bool, **_: object) -> bool:
    return not tiled and tensor_cores


def accepts_gemv(*, tiled: bool, **_: object) -> bool:
    return not tiled


def tiles(
    data: Any, p: Any, row0: int, rows: int, x: Any, y: Any, ldy: int, split_x: bool = True
) -> None:
    for a in range(0, x.shape[0], tile_products.MAX_ROWS):
        b = a + tile_products.MAX_ROWS
        tile_products.product(data, p, row0, rows, x[a:b], y[a:b], ldy, split_x=split_x)


def tiles_bf16(data: Any, p: Any, row0: int, rows: int, x: Any, y: Any, ldy: int) -> None:
    tiles(data, p, row0, rows, x, y, ldy, split_x=False)


def tensor_cores(data: Any, p: Any, row0: int, rows: int, x: Any, y: Any, ldy: int) -> None:
    kernels.small_gemm(data, p, row0, rows, x, y, ldy)


def tensor_cores_bf16(data: Any, p: Any, row0: int, rows: int, x: Any, y: Any, ldy: int) -> None:
    kernels.small_gemm(data, p, row0, rows, x, y, ldy, split_x=False)


def gemv(data: Any, p: Any, row0: int, rows: int, x: Any, y: Any, ldy: int) -> None:
    for a in range(0, x.shape[0], MAX_GEMV_ROWS):
        kernels.gemv(data, p, row0, rows, x[a : a + MAX_GEMV_ROWS], y[a : a + MAX_GEMV_ROWS], ldy)
