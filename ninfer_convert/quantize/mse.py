"""``stored_scale_mse``: per group, the stored scale word with the least squared error.

Decision 5. The search runs over the values that will actually be stored (binary16 group scale
words for q4/q5/q6/q8/nf4, E4M3FN block scale bytes for nvfp4); every candidate's codes come
from the same rule as the absmax encoder (``rint(f32(x * f32(1/s)))`` clamped, nf4: nearest
level, nvfp4: ``(x * d_w) / e4m3(s)`` and the E2M1 thresholds), and its error is measured
against the values a reader decodes. The absmax result is candidate 0 and a candidate replaces
the current best only when its error is strictly smaller, so the result is never worse than
absmax. This follows fork family A/B of notes 2.3 without their importance weighting.

Candidate grid for the grouped formats (``qmax`` = 7/15/31/127; nf4: 1), per group, in order:

1. the ``grouped_absmax`` word ``w0``;
2. ``f16(f32(float64(amax) * i / (64 * qmax)))`` for ``i`` in 32..67 except 64, i.e. the
   absmax scale times the 35 factors ``i/64`` in [0.5, 1.047] (64 is ``w0`` itself);
3. the words ``wb + d`` for ``d`` in -8, -4, -2, -1, 1, 2, 4, 8 around the best word ``wb``
   of steps 1-2 (binary16 words of one sign are ordered like their values, and one word is a
   relative step of 2^-10, so these refine the 1/64 grid; q8 gains most);
4. the least-squares refit ``s = sum(x * v) / sum(v * v)`` of the best codes' decoded levels
   ``v`` (integer codes, nf4 levels), rounded float64 -> f32 -> f16, and its words -1/+1.

Rounded candidates that underflow to 0 become 0x0001 (as the absmax rescue); candidates outside
(0, 0x7BFF] are skipped. An all-zero group keeps scale +0.

nvfp4: the weight divisor is the ``nvfp4_absmax`` one; per block of 16 the candidates are the
absmax scale byte ``s0`` and the bytes ``s0 - 8 .. s0 + 3`` (E4M3FN bytes of one sign are
ordered like their values; -8 is about half the scale), skipping those outside [0x01, 0x7E].

Error: ``sum((x - w)^2)`` with ``w`` the decoded float32 value (``f32(scale) * code``,
``f32(scale) * NF4[code]``, ``f32(e2m1 * e4m3) / d_w``): the float32 difference (exact but
for rare edge cases), squared exactly in float64 and summed by a fixed pairwise tree, so the
choice is the same on CPU and CUDA. Candidate scales are derived on the host; the device only
evaluates them.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ninfer_format.codecs.row_split import FORMATS, RowSplitFormat
from ninfer_format.numeric import NF4_CODEBOOK, f16_to_f32, f32_to_f16

from . import _common as common
from . import grouped, nvfp4

GRID = tuple(i for i in range(32, 68) if i != 64)  # factors i / 64
NEIGHBOURS = (-8, -4, -2, -1, 1, 2, 4, 8)
MAX_F16_WORD = 0x7BFF  # largest finite binary16
NVFP4_WINDOW = tuple(d for d in range(-8, 4) if d != 0)
MAX_E4M3_WORD = 0x7E


# --- grouped formats --------------------------------------------------------------------------


@functools.cache
def _f16_host_tables() -> tuple[np.ndarray, np.ndarray]:
    words = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = f16_to_f32(words)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inverse = np.where(values == 0, np.float32(0), np.float32(1) / values)
    return values, inverse.astype(np.float32)


def _f16_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Value and ``f32(1/value)`` of every binary16 word (host-computed; +0 -> inverse 0)."""
    values, inverse = _f16_host_tables()
    return common.table("f16_values", values, device), common.table("f16_inverse", inverse, device)


def _search_words(candidate: np.ndarray, amax: np.ndarray) -> np.ndarray:
    """Float scales (host, float64) -> binary16 words with the rescue; invalid -> -1."""
    with np.errstate(over="ignore", invalid="ignore"):
        words = f32_to_f16(candidate.astype(np.float32)).astype(np.int64)
    words[(words == 0) & (amax > 0)] = 1
    bad = ~np.isfinite(candidate) | (candidate <= 0) | (words > MAX_F16_WORD) | (amax == 0)
    words[bad] = -1
    return words


class _GroupSearch:
    """Errors and codes of candidate scale words for one chunk of groups.

    The values are held lane-major, ``[G, groups]``: every per-group quantity is then one
    contiguous row broadcast down the lanes, and the pairwise error tree adds whole contiguous
    halves, which is several times faster than reducing short rows.
    """

    def __init__(self, fmt: RowSplitFormat, groups: torch.Tensor) -> None:
        self.fmt = fmt
        self.shape = groups.shape
        self.x = groups.reshape(-1, fmt.group).t().contiguous()  # [G, M]
        self.values, self.inverse = _f16_tables(groups.device)
        self.levels = common.table("nf4_levels", NF4_CODEBOOK, groups.device) if fmt.nf4 else None

    def decoded(self, words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes (integer codes as float32 / NF4 indices) and their levels (float32)."""
        y = self.x * self.inverse[words]
        if self.fmt.nf4:
            index = torch.bucketize(y, grouped.nf4_thresholds(y.device), out_int32=True)
            return index, self.levels[index]
        q = y.round_().clamp_(self.fmt.qmin, self.fmt.qmax)
        return q, q

    def error(self, words: torch.Tensor) -> torch.Tensor:
        """``sum((x - w)^2)`` per group, ``w`` the decoded float32 value.

        ``x - w`` in float32 is exact but for rare edge cases (Sterbenz: nearest-code rounding
        keeps ``x`` within a factor 2 of a non-zero ``w``, and ``w = 0`` leaves ``x``), and it is
        one IEEE operation, so it is the same on every device. Its square is exact in float64;
        the sum is a fixed tree. Half the traffic of subtracting in float64.
        """
        _, level = self.decoded(words)
        w = level.mul_(self.values[words]) if not self.fmt.nf4 else level * self.values[words]
        r = torch.sub(self.x, w, out=w).to(torch.float64)
        return common.tree_sum_rows(r.square_())

    def lanes(self, words: torch.Tensor) -> torch.Tensor:
        codes, _ = self.decoded(words)
        if self.fmt.nf4:
            lanes = codes.to(torch.uint8)
        else:
            lanes = codes.to(torch.int8).view(torch.uint8) & ((1 << self.fmt.bits) - 1)
        return lanes.t().reshape(self.shape[0], -1)

    def refit(self, words: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """``sum(x * v)`` and ``sum(v * v)`` of the levels ``v`` of ``words`` (float64; the
        products are exact, the tree order fixed)."""
        _, level = self.decoded(words)
        v = level.to(torch.float64)
        xv = common.tree_sum_rows(self.x.to(torch.float64) * v)
        return common.host(xv), common.host(common.tree_sum_rows(v.square_()))


def choose_mse(fmt: RowSplitFormat, groups: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    rows = groups.shape[0]
    amax = common.host(groups.abs().amax(dim=2)).reshape(-1)
    w0 = grouped.absmax_words(fmt, amax).astype(np.int64)  # raises where absmax overflows
    search = _GroupSearch(fmt, groups)
    best = common.device_tensor(w0, groups)
    best_error = search.error(best)

    def consider(words: torch.Tensor) -> None:
        nonlocal best, best_error
        valid = words >= 0
        words = torch.where(valid, words, best)
        error = search.error(words)
        better = valid & (error < best_error)
        best = torch.where(better, words, best)
        best_error = torch.where(better, error, best_error)

    qmax = 1 if fmt.nf4 else fmt.qmax
    amax64 = amax.astype(np.float64)
    for i in GRID:
        consider(common.device_tensor(_search_words(amax64 * i / (64 * qmax), amax), groups))

    nonzero = common.device_tensor(amax > 0, groups)
    center = best
    for step in NEIGHBOURS:
        words = center + step
        ok = nonzero & (words >= 1) & (words <= MAX_F16_WORD)
        consider(torch.where(ok, words, -1))

    numerator, denominator = search.refit(best)
    with np.errstate(divide="ignore", invalid="ignore"):
        fitted = np.where(denominator > 0, numerator / denominator, np.nan)
    ls = common.device_tensor(_search_words(fitted, amax), groups)
    consider(ls)
    for step in (-1, 1):
        words = ls + step
        consider(torch.where((ls >= 0) & (words >= 1) & (words <= MAX_F16_WORD), words, -1))

    return search.lanes(best), common.host(best).astype(np.uint16).reshape(rows, -1)


def stored_scale_mse_grouped(values: torch.Tensor, format: str) -> bytes:
    return grouped.encode_row_split(
        FORMATS[format], values, choose_mse, common.chunk_values(values.device, search=True)
    )


# --- nvfp4 ------------------------------------------------------------------------------------


def choose_mse_nvfp4(blocks: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    rows = blocks.shape[0]
    s0 = nvfp4.absmax_scales(blocks, d).reshape(-1)
    device = blocks.device
    scale_values = nvfp4.e4m3_values(device)
    nibble_values = nvfp4.e2m1_values(device)
    x = blocks.reshape(-1, nvfp4.BLOCK).t().contiguous()  # lane-major [16, M], as above
    xd = x * d

    def codes(words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sv = scale_values[words]
        y = torch.where(sv == 0, 0.0, xd / sv)
        return nvfp4.e2m1_nibbles(y), sv

    def error(words: torch.Tensor) -> torch.Tensor:
        nibbles, sv = codes(words)
        w = nibble_values[nibbles].mul_(sv).div_(d)  # exactly the decoder's float32
        r = torch.sub(x, w, out=w).to(torch.float64)  # see _GroupSearch.error
        return common.tree_sum_rows(r.square_())

    start = common.device_tensor(s0.astype(np.int64), blocks)
    best = start
    best_error = error(best)
    for step in NVFP4_WINDOW:
        words = start + step
        valid = (start > 0) & (words >= 1) & (words <= MAX_E4M3_WORD)
        words = torch.where(valid, words, start)
        err = error(words)
        better = valid & (err < best_error)
        best = torch.where(better, words, best)
        best_error = torch.where(better, err, best_error)
    nibbles, _ = codes(best)
    nibbles = nibbles.to(torch.uint8).t().reshape(rows, -1)
    return nibbles, common.host(best).astype(np.uint8).reshape(rows, -1)


def stored_scale_mse_nvfp4(values: torch.Tensor, divisors: int = 1) -> bytes:
    return nvfp4.encode_nvfp4(
        values, divisors, choose_mse_nvfp4, common.chunk_values(values.device, search=True)
    )
