"""The lookup tables of the ``gguf_*`` decoders (``kernels/gguf_decode.cuh``) and of the tile
kernel's iq2_xxs (``kernels/tiles.cu``) as C source.

The grids, sign table and IQ4 values are ggml's; they are generated from the gguf package's
own tables when the kernels are built, so the tree keeps no copy of them. Each grid row of 8
values is one u64 (byte j = value j as int8), of 4 values one u32, and the text starts with
the macros that let the decoders compile both for the device (NVRTC) and the host (g++).
On the device the decoders' tables sit in global memory, read through L1: the lanes of a
warp look up different rows at once, which constant memory would serve one address at a
time (the tile kernel copies its iq2_xxs tables into shared memory).
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
    """iq2_xxs's grid and signs as the tile kernel reads them (``kernels/tiles.cu``,
    TileIQ2XXSWith).

    ggml's grid values are three (8, 25, 43): their bf16 low bytes and high bytes, the high
    ones also negated, fit the eight bytes of two words, ``TILE_IQ2XXS_BYTES_LO/HI`` (low
    bytes at 0..2, high bytes 3..4, negated high bytes 5..6). A grid row is then the ``prmt``
    selectors of its eight bf16 values out of those bytes, one u64 (value k's low byte
    selector at bit 8 k, its high byte's at 8 k + 4), and a negative value is its high byte
    selector plus 2: ``TILE_IQ2XXS_SIGN_ADDS`` holds, for each 7-bit sign index, those adds
    (2 at bit 8 k + 4 where ggml's sign byte has bit k set).
    """
    import gguf.quants as q

    q.IQ2_XXS.init_grid()
    grid = q.IQ2_XXS.grid.reshape(256, 8).astype(np.float32)
    values = np.unique(grid)
    bf16 = (values.view(np.uint32) >> 16).astype(np.int64)  # (small integers: exact)
    low, high = bf16 & 0xFF, bf16 >> 8
    highs = np.unique(high)
    if len(values) != 3 or len(highs) != 2 or np.any(np.isin(highs | 0x80, high)):
        raise ValueError("iq2_xxs grid: expected three positive values with two bf16 high bytes")
    table = [*low, *highs, *(highs | 0x80), 0]
    words = [sum(int(b) << (8 * i) for i, b in enumerate(table[w * 4 : w * 4 + 4])) for w in (0, 1)]
    code = np.searchsorted(values, grid)  # the index of each value's low byte
    high_at = 3 + np.searchsorted(highs, high[code])
    nibbles = code | (high_at << 4)  # [row, value]: a selector byte
    byte_at = np.arange(8, dtype=np.uint64) * np.uint64(8)
    rows = np.bitwise_or.reduce(nibbles.astype(np.uint64) << byte_at, axis=1)
    signs = np.frombuffer(q.IQ2_XXS.ksigns, dtype=np.uint8).astype(np.uint64)
    bits = (signs[:, None] >> np.arange(8, dtype=np.uint64)) & np.uint64(1)
    adds = np.bitwise_or.reduce(bits << (byte_at + np.uint64(5)), axis=1)  # (bit 5 of byte k)

    def table(name: str, u64: np.ndarray) -> str:
        body = ",".join(f"{int(w) & 0xFFFFFFFF:#x},{int(w) >> 32:#x}" for w in u64)
        return f"__device__ const __align__(16) u32 {name}[{2 * u64.size}] = {{{body}}};\n"

    return (
        f"#define TILE_IQ2XXS_BYTES_LO {words[0]:#x}u\n"
        f"#define TILE_IQ2XXS_BYTES_HI {words[1]:#x}u\n"
        + table("TILE_IQ2XXS_SELECTORS", rows)
        + table("TILE_IQ2XXS_SIGN_ADDS", adds)
    )
