"""``fp8_row_maxabs``: E4M3FN codes with one BF16 multiplier per row (spec 3.4, notes 2.4).

Upstream's ``MAXABS_BF16S_RECIP_E4M3FN_RNE_V1``: the source is rounded to BF16 first (so an
fp32 checkpoint and its BF16 copy give the same bytes), the row scale is
``bf16(f32(amax / 448))`` with a 0x0001 rescue, codes are the nearest E4M3FN value of
``f32(x * f32(1/scale))`` clamped to +-448, ties to the even code word, sign from signbit.
Bytes equal ``ninfer_format.codecs.fp8_row.CODEC.encode`` on CPU and CUDA.
"""

from __future__ import annotations

import numpy as np
import torch

from ninfer_format.codecs.fp8_row import CODEC
from ninfer_format.numeric import E4M3FN_MAX, bf16_to_f32, f32_to_bf16

from . import _common as common

FORMAT = "fp8_e4m3fn_row_bf16"


def fp8_row_maxabs(values: torch.Tensor, format: str = FORMAT) -> bytes:
    what = f"{FORMAT}/row_scale_v1"
    common.check_float(values, what)
    n, k = common.rank2(values, what)
    geo = CODEC.geometry((n, k))
    out = np.zeros(geo.size, dtype=np.uint8)
    words = np.zeros(n, dtype="<u2")
    exact = values.dtype == torch.bfloat16  # already on the BF16 grid: no rounding pass
    for rows in common.row_chunks(n, k, common.chunk_values(values.device)):
        try:
            codes, words[rows] = _rows(common.as_f32(values[rows]), exact)
        except common.NonFinite:
            common.raise_non_finite(values[rows], rows.start)
        out[rows.start * k : rows.stop * k] = common.host(codes.reshape(-1))
    out[geo.scale_offset :] = words.view(np.uint8)
    return out.tobytes()


def _rows(x: torch.Tensor, bf16_exact: bool) -> tuple[torch.Tensor, np.ndarray]:
    raw_amax = common.host(x.abs().amax(dim=1))
    common.check_amax(raw_amax)  # before rounding: the bit trick is not meant for NaN
    # RNE is monotonic, so the absmax of the rounded row is the rounded absmax.
    amax = bf16_to_f32(f32_to_bf16(raw_amax))
    if not bf16_exact:
        x = common.bf16_round_bits(x).view(torch.float32)
    # Host: scale word and reciprocal, exactly as the numpy reference computes them.
    words = f32_to_bf16((amax.astype(np.float64) / E4M3FN_MAX).astype(np.float32))
    words[(words == 0) & (amax > 0)] = 0x0001
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(words == 0, np.float32(0), np.float32(1) / bf16_to_f32(words))
    inv = inv.astype(np.float32)
    y = x * common.device_tensor(inv, x)[:, None]
    if np.isinf(inv).any():
        # Below 2^-128 the reciprocal overflows to Inf, as in the reference; zeros stay zeros
        # instead of becoming Inf * 0 = NaN.
        y = torch.where(x == 0, x, y)
    codes = common.e4m3fn_bytes(y.clamp_(-E4M3FN_MAX, E4M3FN_MAX))
    if np.any(words == 0):  # all-zero rows: +0 codes, even for -0 inputs
        codes = torch.where(common.device_tensor(words == 0, x)[:, None], 0, codes)
    return codes, words
