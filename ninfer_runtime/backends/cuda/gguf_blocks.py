"""Launchers for the kernels that read ``gguf_*`` objects in place (``kernels/gguf.cu``).

The decoders are ``kernels/gguf_decode.cuh``, their lookup tables generated from the gguf
package (``gguf_tables``); ``kernels.gemv`` and ``kernels.dequant_rows`` route ``gguf_*``
planes here, so every product, prefill slab and embedding lookup reads the blocks as stored.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_format.codecs.gguf_blocks import FORMAT_BLOCKS

from . import formats as F
from .compile import KERNEL_DIR, function, register_family
from .gguf_tables import source as table_source

FAMILY = "gguf"
#: warps of a GEMV block (GGUF_WARPS in kernels/gguf.cu, defined by the prelude)
WARPS = 4
#: activation rows M a GEMV launch is compiled for (a launch's rows are rounded up to one),
#: and the output rows R each warp takes for it: with one activation row, four weight rows
#: share each x load; with more, two (their decoded groups are held while x streams by)
ROWS_PER_WARP = {1: 4, 2: 2, 4: 2, 8: 2}
#: pairs a unit of the experts' grouped GEMV takes: the most rows a GEMV launch takes
#: (``kernels.MAX_GEMV_ROWS``, which ``moe.GROUP_PAIRS`` is; a test holds them equal)
EXPERT_GROUP = max(ROWS_PER_WARP)
TYPES = sorted(ggml_type for ggml_type, _, _ in FORMAT_BLOCKS.values())


def _prelude() -> str:
    decoders = (KERNEL_DIR / "gguf_decode.cuh").read_text()
    return f"{table_source()}\n#define GGUF_WARPS {WARPS}\n{decoders}"


register_family(
    FAMILY,
    [f"gguf_dequant_rows<{t}>" for t in TYPES]
    + [f"gguf_dequant_rows_bf16<{t}>" for t in TYPES]
    + [f"gguf_gemv<{t}, {m}, {r}>" for t in TYPES for m, r in ROWS_PER_WARP.items()]
    + [
        f"gguf_gemv_experts<{t}, {m}, {ROWS_PER_WARP[m]}>" for t in TYPES for m in (1, EXPERT_GROUP)
    ],
    prelude=_prelude,
)


def _type(p: F.Planes) -> int:
    return p.code - F.GGUF_BASE


def gemv(data: Any, p: F.Planes, row0: int, rows: int, x: Any, y: Any, ldy: int) -> None:
    """``kernels.gemv`` for a ``gguf_*`` object (x: float32, ``p.columns`` wide, rows 16-byte
    aligned; at most 8 rows)."""
    m = x.shape[0]
    bucket = next(b for b in ROWS_PER_WARP if b >= m)
    r = ROWS_PER_WARP[bucket]
    function(FAMILY, f"gguf_gemv<{_type(p)}, {bucket}, {r}>")(
        (-(-rows // (WARPS * r)),),
        (WARPS * 32,),
        (
            data,
            np.int32(p.stride),
            np.int32(row0),
            np.int32(rows),
            np.int32(m),
            x,
            np.int32(x.shape[1]),
            y,
            np.int32(ldy),
        ),
    )


def dequant_rows(data: Any, p: F.Planes, rows: Any, out: Any) -> None:
    """``kernels.dequant_rows`` for a ``gguf_*`` object (out float32 or bf16 words)."""
    n = int(rows.shape[0])
    kernel = "gguf_dequant_rows" if out.dtype == np.float32 else "gguf_dequant_rows_bf16"
    threads = 256
    groups = n * (p.columns // 32)
    grid = min(-(-groups // threads), 65535 * 8)
    function(FAMILY, f"{kernel}<{_type(p)}>")(
        (grid,),
        (threads,),
        (data, np.int32(p.stride), rows, np.int32(n), np.int32(p.columns), out),
    )


def experts_gemv(
    base: Any,
    row0: Any,
    p: F.Planes,
    units: Any,
    rows: int,
    x: Any,
    y: Any,
    ldy: int,
    *,
    group: int = 1,
    k: int = 1,
    x_per_unit: bool = True,
) -> None:
    """The experts' product for ``gguf_*`` banks (``moe.expert_gemv`` with ``group`` 1,
    ``moe.expert_groups_gemv`` with ``EXPERT_GROUP``): unit u (a pair, or a group of
    ``group`` pairs) multiplies its x rows with rows ``row0[e] ..`` of the object at
    ``base[e]``, ``e = units[u]``."""
    r = ROWS_PER_WARP[group]
    function(FAMILY, f"gguf_gemv_experts<{_type(p)}, {group}, {r}>")(
        (-(-rows // (WARPS * r)), int(units.size)),
        (WARPS * 32,),
        (
            base,
            row0,
            units,
            np.int32(k),
            np.int32(x_per_unit),
            np.int32(p.stride),
            np.int32(rows),
            x,
            np.int32(x.shape[1]),
            y,
            np.int32(ldy),
        ),
    )
