"""The small-M kernels ``gpu_bench.py`` times on one packed object, each launched the way the
engine launches it for that many activation rows (no CuPy here: the choice is testable on a
CPU).

* ``product``: the linear family's ``product`` as its policy resolves it, the engine's own
  choice for the stored layout (the tensor-core kernel where ``TENSOR_CORES_FROM`` says it is
  faster, and always beyond ``MAX_GEMV_ROWS`` rows where it reads the layout; else the SIMT
  GEMV);
* ``simt``: the SIMT GEMV alone (the ``gemv`` provider), ``MAX_GEMV_ROWS`` rows a launch;
* ``tc``: the tensor-core kernel alone (the ``tensor_cores`` provider, up to
  ``MAX_SMALL_ROWS`` rows in one launch);
* ``tc_bf16``: the tensor-core kernel with x rounded once to bf16 (``product_bf16``'s
  ``tensor_cores``: one mma a tile instead of the split x's two);
* ``tiles``: the tile kernel on the tile-packed copy the loader makes of large q4/q5/q8 and
  GGUF objects, through ``product`` (``tile_products.MAX_ROWS`` rows a launch);
* ``tiles_bf16``: the same kernel with x rounded once (the linear family's ``product_bf16``,
  the production precision: half the mma columns of the split x ``tiles`` carries).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ninfer_runtime.backends.cuda import formats as F
from ninfer_runtime.backends.cuda import kernels
from ninfer_runtime.backends.cuda import tiles as tile_packing
from ninfer_runtime.ops.linear import nvrtc, product_key, served_by

#: activation rows every kind takes (more go to the prefill GEMM, not a small-M kernel)
MOST_ROWS = kernels.MAX_SMALL_ROWS


def check_rows(rows: tuple[int, ...]) -> None:
    """Refuse, in one line, activation row counts no small-M kernel takes."""
    bad = [m for m in rows if not 1 <= m <= MOST_ROWS]
    if bad:
        raise ValueError(
            f"--rows {','.join(map(str, bad))}: the small-M kernels take 1..{MOST_ROWS} "
            "activation rows (more run as a prefill GEMM)"
        )


def kinds(p: F.Planes) -> list[str]:
    """The kinds timed for an object of stored planes ``p`` (``product`` always)."""
    names = ["product"]
    if kernels.has_tensor_cores(p):  # the tensor-core kernel against the SIMT GEMV
        names += ["simt", "tc", "tc_bf16"]
    if p.code in tile_packing.TILED_CODES:
        names += ["tiles", "tiles_bf16"]
    return names


def planes_for(kind: str, p: F.Planes) -> F.Planes:
    """The planes ``kind`` reads: the tile-packed ones for the tile kinds, else the stored
    ones."""
    tiled = kind in ("tiles", "tiles_bf16")
    return tile_packing.tiled_planes(p.code, p.rows, p.columns) if tiled else p


def launcher(kind: str, q: F.Planes) -> Callable[[Any, Any, Any], None]:
    """``launch(data, x, y)``: ``y = x Wᵀ`` over every row of an object of planes ``q``
    (``planes_for(kind, ...)``) with ``kind``'s kernel, for any 1..``MOST_ROWS`` rows of x."""
    n = q.rows

    def product(data: Any, x: Any, y: Any) -> None:  # the provider the engine would resolve
        getattr(nvrtc, served_by(product_key(q, n, x.shape[0])))(data, q, 0, n, x, y, n)

    def simt(data: Any, x: Any, y: Any) -> None:
        nvrtc.gemv(data, q, 0, n, x, y, n)

    def tensor_cores(data: Any, x: Any, y: Any) -> None:
        nvrtc.tensor_cores(data, q, 0, n, x, y, n)

    def tensor_cores_bf16(data: Any, x: Any, y: Any) -> None:
        nvrtc.tensor_cores_bf16(data, q, 0, n, x, y, n)

    def tiles_bf16(data: Any, x: Any, y: Any) -> None:
        nvrtc.tiles_bf16(data, q, 0, n, x, y, n)

    launchers = {
        "product": product,
        "simt": simt,
        "tc": tensor_cores,
        "tc_bf16": tensor_cores_bf16,
        "tiles": product,
        "tiles_bf16": tiles_bf16,
    }
    return launchers[kind]
