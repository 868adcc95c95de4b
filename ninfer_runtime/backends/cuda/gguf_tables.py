"""The lookup tables of the ``gguf_*`` decoders (``kernels/gguf_decode.cuh``) as C source.

The grids, sign table and IQ4 values are ggml's; they are generated from the gguf package's
own tables when the kernels are built, so the tree keeps no copy of them. Each grid row of 8
values is one u64 (byte j = value j as int8), of 4 values one u32, and the text starts with
the macros that let the decoders compile both for the device (NVRTC) and the host (g++).
On the device the tables sit in global memory, read through L1: the lanes of a warp look up
different rows at once, which constant memory would serve one address at a time.
"""

from __future__ import annotations

import functools

import numpy as np

PRELUDE = """\
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define GG_HD __device__ __forceinline__
#define GG_TABLE __device__ const
#define GG_MUL(a, b) __fmul_rn(a, b)
#define GG_ADD(a, b) __fadd_rn(a, b)
#define GG_SUB(a, b) __fsub_rn(a, b)
#define GG_I2F(q) __fsub_rn(__int_as_float(0x4B400000 + (int)(q)), 12582912.0f)
#define GG_FMA(a, b, c) __fmaf_rn(a, b, c)
#else
#define GG_HD static inline
#define GG_TABLE static const
#define GG_MUL(a, b) ((a) * (b))
#define GG_ADD(a, b) ((a) + (b))
#define GG_SUB(a, b) ((a) - (b))
#define GG_I2F(q) ((float)(int)(q))
#define GG_FMA(a, b, c) __builtin_fmaf(a, b, c)
#endif
"""


def _rows(grid: np.ndarray, width: int) -> list[int]:
    """Each grid row packed little-endian, one byte (int8) a value."""
    values = grid.reshape(-1, width).astype(np.int8).view(np.uint8).astype(np.uint64)
    shifts = (np.arange(width, dtype=np.uint64) * np.uint64(8))[None, :]
    return [int(v) for v in np.bitwise_or.reduce(values << shifts, axis=1)]


def _table(ctype: str, name: str, values: list[int]) -> str:
    body = ",".join(f"{v:#x}" if ctype != "signed char" else str(v) for v in values)
    return f"GG_TABLE {ctype} {name}[{len(values)}] = {{{body}}};\n"


@functools.cache
def source() -> str:
    import gguf.quants as q

    parts = [PRELUDE]
    for cls, name, width in (
        (q.IQ2_XXS, "GG_IQ2XXS_GRID", 8),
        (q.IQ2_XS, "GG_IQ2XS_GRID", 8),
        (q.IQ2_S, "GG_IQ2S_GRID", 8),
        (q.IQ3_XXS, "GG_IQ3XXS_GRID", 4),
        (q.IQ3_S, "GG_IQ3S_GRID", 4),
        (q.IQ1_S, "GG_IQ1S_GRID", 8),
    ):
        cls.init_grid()
        parts.append(_table("u64" if width == 8 else "u32", name, _rows(cls.grid, width)))
    parts.append(_table("u8", "GG_KSIGNS", list(q.IQ2_XXS.ksigns)))
    parts.append(_table("signed char", "GG_IQ4_VALUES", list(q.IQ4_NL.kvalues)))
    parts.append(f"#define GG_IQ1_DELTA {float(q.IQ1_S.delta)!r}f\n")
    return "".join(parts)
