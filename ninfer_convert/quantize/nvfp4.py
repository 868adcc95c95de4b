"""``nvfp4_absmax`` and the ``block_scale_k16_m128x4_v1`` packer (notes 2.5).

One FP32 weight divisor per stacked matrix, ``d_w = f32(2688 / amax)`` (1.0 for an all-zero
matrix), then per block of 16: ``s = E4M3FN(min(block_amax * d_w / 6, 448))`` with a 0x01
rescue, ``y = (x * d_w) / e4m3(s)``, E2M1 code by the ties-to-even thresholds. Bytes equal
``ninfer_format.codecs.nvfp4`` ``pack_nvfp4(*nvfp4_absmax(values, divisors))``.

The amax of each matrix needs a full pass before any block can be coded, so the input is read
twice (once for the amax, once chunk by chunk to code it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ninfer_format.codecs.nvfp4 import BLOCK, CODEC, TILE_ROWS
from ninfer_format.errors import CodecError
from ninfer_format.numeric import E2M1_VALUES, E4M3FN_MAX, E4M3FN_VALUES, f32_to_e4m3fn

from ..errors import RecipeError
from . import _common as common

FORMAT = "nvfp4"
_RANGE = np.float32(6 * E4M3FN_MAX)  # amax maps to 6 (largest E2M1) * 448 (largest E4M3FN)

#: chooses, for float32 blocks ``[rows, K/16, 16]`` and the divisor (a 0-dim float32 tensor on
#: the blocks' device), the E2M1 nibbles ``[rows, K]`` (uint8, device) and E4M3FN scale
#: bytes ``[rows, K/16]`` (host, natural order)
Chooser = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, np.ndarray]]


def encode_nvfp4(values: torch.Tensor, divisors: int, choose: Chooser, chunk_values: int) -> bytes:
    what = f"{FORMAT}/block_scale_k16_m128x4_v1"
    common.check_float(values, what)
    n, k = common.rank2(values, what)
    try:
        geo = CODEC.geometry((n, k), divisors)
    except CodecError as exc:
        raise RecipeError(str(exc)) from None
    out = np.zeros(geo.size, dtype=np.uint8)
    scales = np.empty((n, k // BLOCK), dtype=np.uint8)
    divs = np.empty(geo.divisors, dtype=np.float32)
    per = geo.rows_per_divisor
    for i in range(geo.divisors):
        matrix = slice(i * per, (i + 1) * per)
        divs[i] = _divisor(values[matrix], matrix.start, chunk_values, i)
        d = torch.tensor(divs[i], dtype=torch.float32, device=values.device)
        for rows in common.row_chunks(per, k, chunk_values, multiple=TILE_ROWS):
            rows = slice(matrix.start + rows.start, matrix.start + rows.stop)
            x = common.as_f32(values[rows])  # checked by _divisor
            nibbles, scales[rows] = choose(x.view(x.shape[0], k // BLOCK, BLOCK), d)
            pairs = nibbles.reshape(-1, 2)
            out[rows.start * k // 2 : rows.stop * k // 2] = common.host(
                pairs[:, 0] | (pairs[:, 1] << 4)
            )
    out[geo.scale_offset : geo.divisor_offset] = swizzle(scales)
    out[geo.divisor_offset :] = divs.astype("<f4").view(np.uint8)
    return out.tobytes()


def _divisor(matrix: torch.Tensor, first_row: int, chunk_values: int, index: int) -> np.float32:
    amax = np.float32(0)
    for rows in common.row_chunks(matrix.shape[0], matrix.shape[1], chunk_values):
        chunk_amax = common.host(common.as_f32(matrix[rows]).abs().amax())
        if not np.isfinite(chunk_amax):
            common.raise_non_finite(matrix[rows], first_row + rows.start)
        amax = max(amax, np.float32(chunk_amax))
    with np.errstate(divide="ignore", over="ignore"):
        divisor = np.float32(1) if amax == 0 else _RANGE / amax
    if not (np.isfinite(divisor) and divisor > 0):
        raise RecipeError(
            f"{FORMAT}: matrix {index}: absmax {float(amax)!r} gives no finite weight divisor"
        )
    return divisor


def swizzle(natural: np.ndarray) -> np.ndarray:
    """Natural ``[N, K/16]`` scale bytes -> the stored 128x4-tile plane (spec 4.3)."""
    rows, blocks = natural.shape
    tiled = natural.reshape(rows // TILE_ROWS, 4, 32, blocks // 4, 4)
    return tiled.transpose(0, 3, 2, 1, 4).reshape(-1)


def e2m1_thresholds(device: torch.device) -> torch.Tensor:
    """Magnitude thresholds of notes 2.5 as strict ``>`` tests (``>= t`` is ``> prev(t)``)."""
    strict = np.array([0.25, 1.25, 2.5, 5.0], dtype=np.float32)
    at_least = np.array([0.75, 1.75, 3.5], dtype=np.float32)
    below = np.nextafter(at_least, np.float32(-np.inf))
    return common.table("e2m1_thresholds", np.sort(np.concatenate([strict, below])), device)


def e2m1_nibbles(y: torch.Tensor) -> torch.Tensor:
    """float32 -> E2M1 nibbles (int32): magnitude code plus sign bit 3 from signbit."""
    magnitude = torch.bucketize(y.abs(), e2m1_thresholds(y.device), out_int32=True)
    return magnitude | (torch.signbit(y).to(torch.int32) << 3)


def e4m3_values(device: torch.device) -> torch.Tensor:
    return common.table("e4m3fn_values", E4M3FN_VALUES, device)


def e2m1_values(device: torch.device) -> torch.Tensor:
    return common.table("e2m1_values", E2M1_VALUES, device)


def block_codes(xd: torch.Tensor, scale_values: torch.Tensor) -> torch.Tensor:
    """``y = (x * d_w) / e4m3(s)`` (0 where s is 0) -> nibbles; ``xd`` is ``x * d_w``."""
    sv = scale_values[:, :, None]
    y = torch.where(sv == 0, 0.0, xd / sv)
    return e2m1_nibbles(y)


def absmax_scales(blocks: torch.Tensor, d: torch.Tensor) -> np.ndarray:
    """The block scale bytes, on the host in the reference's float32 order of operations."""
    block_amax = common.host(blocks.abs().amax(dim=2))
    divisor = np.float32(common.host(d))
    raw = np.minimum(block_amax * divisor / np.float32(6), np.float32(E4M3FN_MAX))
    scales = f32_to_e4m3fn(raw)
    scales[(scales == 0) & (block_amax > 0)] = 0x01
    return scales


def choose_absmax(blocks: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    scales = absmax_scales(blocks, d)
    sv = common.device_tensor(E4M3FN_VALUES[scales], blocks)
    nibbles = block_codes(blocks * d, sv)
    return nibbles.to(torch.uint8).view(blocks.shape[0], -1), scales


def nvfp4_absmax(values: torch.Tensor, format: str = FORMAT, divisors: int = 1) -> bytes:
    return encode_nvfp4(values, divisors, choose_absmax, common.chunk_values(values.device))
