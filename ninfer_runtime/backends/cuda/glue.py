"""Launchers for ``kernels/glue.cu``: RMSNorm (alone, after a residual add, or gated by silu
as Gated DeltaNet's output norm), partial RoPE, the gated MLP's SiLU·up as bf16 words and a
hyper-connection's Sinkhorn-normalised mixing matrices in one kernel each; and many small byte
copies in one launch."""

from __future__ import annotations

from typing import Any

import numpy as np

from .compile import function, register_family

THREADS = 256  # GLUE_THREADS in kernels/glue.cu
WARPS = THREADS // 32
#: rows of at most this many elements take one warp each (GLUE_SHORT_ROW)
SHORT_ROW = 1024
#: a longer row takes a block of this many threads (GLUE_LONG_THREADS)
LONG_THREADS = 1024

register_family(
    "glue",
    [
        "rms_norm_rows",
        "rms_norm_short_rows",
        "add_rms_norm_rows",
        "add_rms_norm_short_rows",
        "gated_rms_norm_rows",
        "rope_rows",
        "silu_mul_bf16_rows",
        "copy_ranges",
        "sinkhorn_rows",
    ],
)
#: the largest n x n mixing matrix ``sinkhorn`` takes (GLUE_SINKHORN_MAX)
SINKHORN_MAX = 8
#: most blocks one range of ``copy_ranges`` takes (a snapshot's runs are page-sized: tens to
#: hundreds of KB), and most ranges a launch takes (the grid's y limit)
COPY_BLOCKS = 32
COPY_RANGES = 65535


def _row_launch(
    name: str, rows: int, d: int
) -> tuple[Any, tuple[int], tuple[int], tuple[Any, ...]]:
    """The kernel for rows of d elements (a warp a row for short ones, a block for long ones),
    its grid and block, and the row count argument the short-row kernels take before d."""
    if d <= SHORT_ROW:
        grid = (-(-rows // WARPS),)
        return function("glue", f"{name}_short_rows"), grid, (THREADS,), (np.int32(rows),)
    return function("glue", f"{name}_rows"), (rows,), (LONG_THREADS,), ()


def rms_norm(x: Any, w: Any, eps: float, offset: float) -> Any:
    """``x / sqrt(mean(x²) + eps) * (w + offset)`` over the last axis (float32)."""
    import cupy as cp

    x = cp.ascontiguousarray(x, dtype=cp.float32)
    d = x.shape[-1]
    y = cp.empty_like(x)
    rows = x.size // d if d else 0
    if rows:
        kernel, grid, block, count = _row_launch("rms_norm", rows, d)
        kernel(
            grid,
            block,
            (
                x,
                cp.ascontiguousarray(w, dtype=cp.float32),
                y,
                *count,
                np.int32(d),
                np.float32(eps),
                np.float32(offset),
            ),
        )
    return y


def add_rms_norm(h: Any, delta: Any, w: Any, eps: float, offset: float) -> tuple[Any, Any]:
    """``s = h + delta`` and ``rms_norm(s, w, eps, offset)`` in one pass (float32): the same
    values as the add followed by ``rms_norm``."""
    import cupy as cp

    h = cp.ascontiguousarray(h, dtype=cp.float32)
    delta = cp.ascontiguousarray(delta, dtype=cp.float32)
    if h.shape != delta.shape:
        raise ValueError(f"add_rms_norm: h {h.shape} and delta {delta.shape} differ")
    d = h.shape[-1]
    s, y = cp.empty_like(h), cp.empty_like(h)
    rows = h.size // d if d else 0
    if rows:
        kernel, grid, block, count = _row_launch("add_rms_norm", rows, d)
        kernel(
            grid,
            block,
            (
                h,
                delta,
                cp.ascontiguousarray(w, dtype=cp.float32),
                s,
                y,
                *count,
                np.int32(d),
                np.float32(eps),
                np.float32(offset),
            ),
        )
    return s, y


def gated_rms_norm(x: Any, gate: Any, w: Any, eps: float) -> Any:
    """``silu(gate) * rms_norm(x, w, eps, offset=0)`` over the last axis of x [T, heads, d]
    (float32), one pass; gate has x's shape and may be a view whose token rows lie further
    apart (a column slice of the projections)."""
    import cupy as cp

    x = cp.ascontiguousarray(x, dtype=cp.float32)
    if gate.shape != x.shape or x.ndim != 3:
        raise ValueError(
            f"gated_rms_norm: x {x.shape} and gate {gate.shape}: expected both [T, heads, d]"
        )
    t, heads, d = x.shape
    if gate.dtype != np.float32 or gate.strides[1:] != (4 * d, 4) or gate.strides[0] % 4:
        gate = cp.ascontiguousarray(gate, dtype=cp.float32)
    y = cp.empty_like(x)
    rows = t * heads
    if rows and d:
        function("glue", "gated_rms_norm_rows")(
            (-(-rows // WARPS),),
            (THREADS,),
            (
                x,
                gate,
                np.int64(gate.strides[0] // 4),
                np.int32(heads),
                cp.ascontiguousarray(w, dtype=cp.float32),
                y,
                np.int32(rows),
                np.int32(d),
                np.float32(eps),
            ),
        )
    return y


def silu_mul_bf16(gate_up: Any) -> Any:
    """``silu(gate) * up`` rounded to bfloat16 words (uint16 [M, I]) for gate_up [M, 2I] =
    gate | up (float32): the down projection's prefill operand, in one pass."""
    import cupy as cp

    gate_up = cp.ascontiguousarray(gate_up, dtype=cp.float32)
    rows, width = gate_up.shape
    if width % 2:
        raise ValueError(f"silu_mul_bf16: gate_up {gate_up.shape}: expected an even width")
    inter = width // 2
    h = cp.empty((rows, inter), dtype=cp.uint16)
    n = rows * (inter // 4 if inter % 4 == 0 else inter)
    if n:
        blocks = max(1, min(-(-n // THREADS), 65535 * 8))
        function("glue", "silu_mul_bf16_rows")(
            (blocks,), (THREADS,), (gate_up, np.int64(rows), np.int32(inter), h)
        )
    return h


def rope(x: Any, cos: Any, sin: Any) -> Any:
    """x [N, heads, D], cos/sin [N, rd] -> rotated copy (NeoX pairs i, i + rd/2)."""
    import cupy as cp

    x = cp.ascontiguousarray(x, dtype=cp.float32)
    heads, d = x.shape[1], x.shape[2]
    rd = cos.shape[-1]
    y = cp.empty_like(x)
    total = x.size
    if total:
        function("glue", "rope_rows")(
            ((total + THREADS - 1) // THREADS,),
            (THREADS,),
            (
                x,
                cp.ascontiguousarray(cos),
                cp.ascontiguousarray(sin),
                y,
                np.int32(heads),
                np.int32(d),
                np.int32(rd),
                np.int64(total),
            ),
        )
    return y


def copy_ranges(dst: Any, src: Any, size: Any) -> None:
    """``size[i]`` bytes from device address ``src[i]`` to ``dst[i]`` for every i (int64
    host arrays; ranges must not overlap), in one launch on the current stream (a launch per
    65,535 ranges)."""
    import cupy as cp

    dst, src, size = (np.ascontiguousarray(a, dtype=np.int64) for a in (dst, src, size))
    if not (dst.shape == src.shape == size.shape and dst.ndim == 1):
        raise ValueError(f"copy_ranges: dst {dst.shape}, src {src.shape}, size {size.shape}")
    for a in range(0, len(size), COPY_RANGES):
        part = slice(a, a + COPY_RANGES)
        table = cp.asarray(np.stack([dst[part], src[part], size[part]]))  # one upload
        wide = not ((dst[part] | src[part] | size[part]) & 15).any()
        words = int(size[part].max()) // (16 if wide else 1)
        blocks = max(1, min(COPY_BLOCKS, -(-words // THREADS)))
        function("glue", "copy_ranges")(
            (blocks, table.shape[1]), (THREADS,), (table[0], table[1], table[2], np.int32(wide))
        )


def sinkhorn(logits: Any, iterations: int, eps: float) -> Any:
    """logits [..., n, n] -> softmax of each row plus ``eps``, then Sinkhorn's normalisation
    (the norm family's ``sinkhorn``), float32, a thread a matrix."""
    import cupy as cp

    n = logits.shape[-1]
    if logits.shape[-2] != n or not 0 < n <= SINKHORN_MAX:
        limit = f"n <= {SINKHORN_MAX}"
        raise ValueError(f"sinkhorn: logits {logits.shape}: expected [..., n, n], {limit}")
    logits = cp.ascontiguousarray(logits, dtype=cp.float32)
    comb = cp.empty_like(logits)
    count = logits.size // (n * n)
    if count:
        function("glue", "sinkhorn_rows")(
            (-(-count // THREADS),),
            (THREADS,),
            (logits, comb, np.int32(count), np.int32(n), np.int32(iterations), np.float32(eps)),
        )
    return comb
