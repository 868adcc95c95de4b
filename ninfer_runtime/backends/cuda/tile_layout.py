"""Tile packing's constants and geometry: the codes the tile kernels read, and where the planes
of a tiled object lie (``tile_geometry``) and what its kernels are passed (``tiled_planes``).
The layouts themselves are described in ``tiles.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer_format.codecs.row_split import FORMATS, row_split_geometry

from . import formats as F

TILE_ROWS = 16
LANES = 32
#: bytes of codes a tile holds (every tiled format)
TILE_CODE_BYTES = 512
#: row tiles packed per pass (bounds the temporaries of a large object)
CHUNK_TILES = 256

_NAMES = {F.Q4: "q4_g64_fp16", F.Q5: "q5_g64_fp16", F.Q8: "q8_g32_fp16"}
Q4_K, Q5_K, Q6_K = (F.GGUF_CODES[f"gguf_q{b}_k"] for b in (4, 5, 6))
IQ2_XXS = F.GGUF_CODES["gguf_iq2_xxs"]
#: bytes of a q4_k/q5_k block's head (d, dmin, scales), and of the blocks
_Q4_K_HEAD, _Q4_K_BLOCK, _Q5_K_BLOCK = 16, 144, 176
#: bytes of a q6_k block (low nibbles, high bits, scales, d) and of a tile's record of scales
_Q6_K_BLOCK, _Q6_K_RECORD = 210, 288
#: bytes of an iq2_xxs block and of a tile's record of scales
_IQ2_XXS_BLOCK, _IQ2_XXS_RECORD = 66, 96
#: the codes the tile kernels read
TILED_CODES = frozenset({*_NAMES, Q4_K, Q5_K, Q6_K, IQ2_XXS})


@dataclass(frozen=True)
class TileGeometry:
    """Where the planes of a tiled ``[rows, columns]`` object lie."""

    code: int
    rows: int
    columns: int
    group: int  # weights per group
    groups: int  # groups per row, padded to a multiple of 4
    row_tiles: int
    high_offset: int
    scale_offset: int
    size: int

    @property
    def x_width(self) -> int:
        """Columns of x the product reads (zero padded past the object's)."""
        return self.groups * self.group


def tile_geometry(code: int, rows: int, columns: int) -> TileGeometry:
    row_tiles = -(-rows // TILE_ROWS)
    if code in (Q4_K, Q5_K):  # (columns: whole blocks, as the codec requires)
        groups = columns // 64
        codes = row_tiles * groups * TILE_CODE_BYTES
        high = codes + (row_tiles * groups * LANES * 4 if code == Q5_K else 0)
        heads = row_tiles * (groups // 4) * TILE_ROWS * _Q4_K_HEAD
        return TileGeometry(code, rows, columns, 64, groups, row_tiles, codes, high, high + heads)
    if code == IQ2_XXS:  # (no code plane: the lane's words are in the second)
        groups = columns // 64
        words = row_tiles * groups * LANES * 8
        records = row_tiles * (groups // 4) * _IQ2_XXS_RECORD
        return TileGeometry(code, rows, columns, 64, groups, row_tiles, 0, words, words + records)
    if code == Q6_K:
        groups = columns // 64
        codes = row_tiles * groups * TILE_CODE_BYTES
        high = codes + row_tiles * groups * LANES * 8
        records = row_tiles * (groups // 4) * _Q6_K_RECORD
        return TileGeometry(code, rows, columns, 64, groups, row_tiles, codes, high, high + records)
    fmt = FORMATS[_NAMES[code]]
    geo = row_split_geometry(fmt.name, (rows, columns))
    groups = -(-geo.groups_per_row // 4) * 4
    codes = row_tiles * groups * TILE_CODE_BYTES
    high = row_tiles * groups * LANES * 4 if code == F.Q5 else 0
    scales = row_tiles * groups * TILE_ROWS * 2
    return TileGeometry(
        code, rows, columns, fmt.group, groups, row_tiles, codes, codes + high,
        codes + high + scales,
    )  # fmt: skip


def tiled_planes(code: int, rows: int, columns: int) -> F.Planes:
    """The kernel arguments of a tiled object: off1 the high bits, off2 the scales (q4_k,
    q5_k: the block heads; q6_k: its records), stride the (padded) groups per row."""
    g = tile_geometry(code, rows, columns)
    return F.Planes(
        code, rows, columns, off1=g.high_offset, off2=g.scale_offset, stride=g.groups,
        x_width=g.x_width, units=g.x_width // 16, tiled=True,
    )  # fmt: skip
