"""The orders of tile packing as tables (which weight each field of a tile holds: ``tiles.py``
describes the word layouts they encode), and the packing of bit fields into words.

Array operations only (numpy or CuPy alike), as all of tile packing.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from . import formats as F
from .tile_layout import LANES, Q4_K, Q5_K, Q6_K, TILED_CODES


# ---------------------------------------------------------------- the orders, as tables
def _code_order(code: int) -> np.ndarray:
    """For each code field of a tile in stored order (lane, word, field), the weight it
    holds as ``row_in_tile * group + k``."""
    lane = np.arange(LANES)[:, None, None]
    g, t = lane // 4, lane % 4
    if code == F.Q8:
        w = np.arange(4)[None, :, None]
        b = np.arange(4)[None, None, :]
        j, h = w // 2, w % 2
        row = g + 8 * (b % 2)
        k = 8 * t + 4 * j + 2 * h + b // 2
        return (row * 32 + k).reshape(-1)
    j = np.arange(4)[None, :, None]
    n = np.arange(8)[None, None, :]
    pair, second = n % 4, n // 4
    row = g + 8 * (pair % 2)
    if code in (Q4_K, Q5_K):  # mma j within sub-block j // 2
        k = 32 * (j // 2) + 8 * t + 4 * (j % 2) + 2 * (pair // 2) + second
    elif code == Q6_K:  # mma j on sub-block j
        k = 16 * j + 4 * t + 2 * (pair // 2) + second
    else:
        k = 16 * t + 4 * j + 2 * (pair // 2) + second
    return (row * 64 + k).reshape(-1)


def _q5_bits() -> np.ndarray:
    """For each bit of a q5 tile in stored order (lane, its 160 bits: words 0-4), the
    (index into ``_code_order(Q4)``'s fields, code bit) it holds, as field * 5 + code bit."""
    out = np.empty((LANES, 160), dtype=np.int64)
    for lane in range(LANES):
        for pair in range(16):
            j, i = divmod(pair, 4)
            for second in range(2):
                field = lane * 32 + j * 8 + i + 4 * second  # q4's (lane, word j, nibble)
                for b in range(5):
                    if pair < 15:
                        w, f = divmod(pair, 3)
                        at = 32 * w + 16 * second + 5 * f + b
                    else:
                        at = 32 * b + 15 + 16 * second
                    out[lane, at] = field * 5 + b
    return out.reshape(-1)


def _q6_high() -> np.ndarray:
    """For each 2-bit field of a lane's two q6_k high words (word w, half, field f), the index
    into the lane's fields in ``_code_order``'s order (word j, nibble n) whose high bits it
    holds: mma j = 2 w + f // 4, pair f % 4, the half its element."""
    w, half, f = np.meshgrid(np.arange(2), np.arange(2), np.arange(8), indexing="ij")
    j, pair = 2 * w + f // 4, f % 4
    return (8 * j + pair + 4 * half).reshape(-1)


def _q5_k_fifth() -> np.ndarray:
    """For each bit of a lane's q5_k fifth-bit word, the index into the lane's fields in
    ``_code_order``'s order (word j, nibble n) whose fifth bit it holds: bit 16 h + 4 j + i
    is element h of pair i of mma j."""
    half, j, i = np.meshgrid(np.arange(2), np.arange(4), np.arange(4), indexing="ij")
    return (8 * j + i + 4 * half).reshape(-1)


_CODE_ORDER = {code: _code_order(code) for code in TILED_CODES}
#: the lane's 32 fields, in the order of its two high words
_Q6_HIGH = _q6_high()
#: the lane's 32 fields, in the order of its q5_k fifth-bit word
_Q5_K_FIFTH = _q5_k_fifth()
_CODE_INVERSE = {code: np.argsort(order) for code, order in _CODE_ORDER.items()}
_Q5_BITS = _q5_bits()
_Q5_INVERSE = np.argsort(_Q5_BITS)  # (field, code bit) -> its bit of the tile


def _pack_fields(xp: ModuleType, fields: Any, bits: int) -> Any:
    """Consecutive ``bits``-wide fields (last axis) into little-endian uint32 words, as bytes."""
    per = 32 // bits
    f = fields.reshape(*fields.shape[:-1], -1, per).astype(xp.uint32)
    shifts = xp.arange(per, dtype=xp.uint32) * np.uint32(bits)
    words = (f << shifts).sum(axis=-1, dtype=xp.uint32)
    return xp.ascontiguousarray(words).view(xp.uint8).reshape(*fields.shape[:-1], -1)


def _unpack_fields(xp: ModuleType, words: Any, bits: int, count: int) -> Any:
    per = 32 // bits
    shifts = xp.arange(per, dtype=xp.uint32) * np.uint32(bits)
    f = (words[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    return f.reshape(*words.shape[:-1], count).astype(xp.uint8)
