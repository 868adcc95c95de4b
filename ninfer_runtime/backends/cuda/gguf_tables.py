"""The lookup tables of the ``gguf_*`` decoders (``kernels/gguf_decode.cuh``) and of the tile
kernel's iq2_xxs (``kernels/tiles.cu``) as C source.

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


@functools.cache
def iq2_xxs_tile_tables() -> str:
    """iq2_xxs's grid and sign tables as the tile kernel reads them (``kernels/tiles.cu``,
    TileIQ2XXS): each grid row's eight values as four bf16x2 words, and each 7-bit sign
    index's eight signs as four xor masks of those words (bits 15 and 31)."""
    import gguf.quants as q

    q.IQ2_XXS.init_grid()
    values = q.IQ2_XXS.grid.reshape(256, 8).astype(np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint64)  # (small integers: exact)
    grid = (bf16[:, 0::2] | (bf16[:, 1::2] << 16)).reshape(-1)
    signs = np.frombuffer(q.IQ2_XXS.ksigns, dtype=np.uint8).astype(np.uint64)
    bits = (signs[:, None] >> np.arange(8, dtype=np.uint64)) & 1
    masks = ((bits[:, 0::2] << 15) | (bits[:, 1::2] << 31)).reshape(-1)

    def table(name: str, words: np.ndarray) -> str:
        body = ",".join(f"{int(w):#x}" for w in words)
        return f"__device__ const __align__(16) u32 {name}[{words.size}] = {{{body}}};\n"

    return table("TILE_IQ2XXS_GRID", grid) + table("TILE_IQ2XXS_SIGNS", masks)
