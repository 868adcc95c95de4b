"""``grouped_absmax`` for q4/q5/q6/q8 and nf4, and the ``row_split_k128_v1`` packer they share.

The encoder is spec 3.2's reference (``MAXABS_F16_RECIP_RNE_V1``, notes 2.1), and for nf4 the
project's variant (decision 4): scale = f16(absmax), code = nearest NF4 level of
``f32(x * f32(1/scale))``, ties to the even index. Its bytes equal
``ninfer_format.codecs.row_split.CODECS[fmt].encode`` for every input, on CPU and on CUDA.

Large matrices are processed in row chunks, each packed straight into its place in the output
planes (a row chunk is a contiguous span of every plane), so memory stays near one float32
copy of a chunk plus the encoded object.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ninfer_format.codecs.row_split import FORMATS, RowSplitFormat, row_split_geometry
from ninfer_format.errors import CodecError
from ninfer_format.numeric import NF4_CODEBOOK, f16_to_f32, f32_to_f16

from ..errors import RecipeError
from . import _common as common

ROW_SPLIT_FORMATS = tuple(FORMATS)

#: chooses, for float32 groups ``[rows, groups, G]``, the code lanes (uint8, already masked to
#: b bits, nf4: level indices) ``[rows, groups * G]`` and the binary16 scale words (host)
Chooser = Callable[[RowSplitFormat, torch.Tensor], tuple[torch.Tensor, np.ndarray]]


def encode_row_split(
    fmt: RowSplitFormat, values: torch.Tensor, choose: Chooser, chunk_values: int
) -> bytes:
    """Chunk, check, choose codes and scales, and lay them out as spec 4.2 prescribes."""
    what = f"{fmt.name}/row_split_k128_v1"
    common.check_float(values, what)
    n, k = common.rank2(values, what)
    try:
        geo = row_split_geometry(fmt.name, (n, k))
    except CodecError as exc:
        raise RecipeError(str(exc)) from None
    out = np.zeros(geo.size, dtype=np.uint8)
    words = np.zeros((n, geo.groups_per_row), dtype="<u2")  # wholly padded groups keep 0x0000
    gpr = geo.groups_per_row
    real_columns = geo.real_groups * fmt.group
    for rows in common.row_chunks(n, k, chunk_values):
        x = common.as_f32(values[rows])
        count = x.shape[0]
        if real_columns != k:  # the partial last group is zero-padded: zeros never move amax
            x = torch.nn.functional.pad(x, (0, real_columns - k))
        try:
            lanes, scale_words = choose(fmt, x.view(count, geo.real_groups, fmt.group))
        except common.NonFinite:
            common.raise_non_finite(values[rows], rows.start)
        if geo.padded_columns != real_columns:
            full = torch.full(
                (count, geo.padded_columns), fmt.pad_code, dtype=torch.uint8, device=lanes.device
            )
            full[:, :real_columns] = lanes
            lanes = full
        base, high = pack_lanes(fmt, lanes)
        start = rows.start * gpr
        out[start * fmt.base_bytes : (start + count * gpr) * fmt.base_bytes] = base
        if high is not None:
            first = geo.high_offset + start * fmt.high_bytes
            out[first : first + count * gpr * fmt.high_bytes] = high
        words[rows, : geo.real_groups] = scale_words
    out[geo.scale_offset :] = words.reshape(-1).view(np.uint8)
    return out.tobytes()


def pack_lanes(fmt: RowSplitFormat, lanes: torch.Tensor) -> tuple[np.ndarray, np.ndarray | None]:
    """Lanes ``[rows, K_pad]`` (uint8, b-bit words) -> base-plane and high-bit-plane bytes.

    Done on the lanes' device; only the packed bytes (b/8 of a byte per value) travel.
    """
    flat = lanes.reshape(-1)
    if fmt.bits == 8:
        return common.host(flat), None
    pairs = flat.view(-1, 2)
    if fmt.bits == 4:
        return common.host(pairs[:, 0] | (pairs[:, 1] << 4)), None
    base = (pairs[:, 0] & 0xF) | ((pairs[:, 1] & 0xF) << 4)
    # High bits: a stream of (b - 4) bits per lane, lane-major, lowest bit first (spec 4.2).
    width = fmt.bits - 4
    per_byte = 8 // width
    fields = (flat >> 4).view(-1, per_byte)
    high = fields[:, 0].clone()
    for i in range(1, per_byte):
        high |= fields[:, i] << (i * width)
    return common.host(base), common.host(high)


# --- grouped_absmax ---------------------------------------------------------------------------


def absmax_words(fmt: RowSplitFormat, amax: np.ndarray) -> np.ndarray:
    """Host-side spec 3.2 scale: f16(f32(amax / qmax)) via float64 (nf4: f16(amax)), 0x0001
    rescue for non-zero groups that underflow; overflow to Inf is a ``RecipeError``."""
    common.check_amax(amax)
    if fmt.nf4:
        words = f32_to_f16(amax)
    else:
        words = f32_to_f16((amax.astype(np.float64) / fmt.qmax).astype(np.float32))
    words[(words == 0) & (amax > 0)] = 0x0001
    if np.any(words == 0x7C00):
        big = float(amax[words == 0x7C00].max())
        raise RecipeError(f"{fmt.name}: a group's absmax {big!r} overflows the binary16 scale")
    return words


def inverse_scales(words: np.ndarray) -> np.ndarray:
    """``f32(1 / f32(scale16))`` on the host (0 for a zero scale), exactly as the reference."""
    scale = f16_to_f32(words)
    with np.errstate(divide="ignore"):
        return np.where(words == 0, np.float32(0), np.float32(1) / scale).astype(np.float32)


def nf4_thresholds(device: torch.device) -> torch.Tensor:
    return common.table("nf4_thresholds", common.pass_thresholds(NF4_CODEBOOK), device)


def code_lanes(fmt: RowSplitFormat, y: torch.Tensor) -> torch.Tensor:
    """Scaled values ``y = f32(x * inv)`` -> stored lanes (uint8)."""
    if fmt.nf4:
        return torch.bucketize(y, nf4_thresholds(y.device), out_int32=True).to(torch.uint8)
    q = torch.round(y).clamp_(fmt.qmin, fmt.qmax).to(torch.int8).view(torch.uint8)
    return q if fmt.bits == 8 else q & ((1 << fmt.bits) - 1)


def choose_absmax(fmt: RowSplitFormat, groups: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    amax = common.host(groups.abs().amax(dim=2))
    words = absmax_words(fmt, amax)
    inv = common.device_tensor(inverse_scales(words), groups)
    y = groups * inv[:, :, None]  # reciprocal-then-multiply is normative
    return code_lanes(fmt, y).view(groups.shape[0], -1), words


def grouped_absmax(values: torch.Tensor, format: str) -> bytes:
    """Spec 3.2 ``grouped_absmax`` (nf4: decision 4) into ``row_split_k128_v1`` bytes."""
    return encode_row_split(
        FORMATS[format], values, choose_absmax, common.chunk_values(values.device)
    )
