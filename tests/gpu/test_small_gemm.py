"""The tensor-core small-M product (``kernels/gemm_small.cu``) against the numpy decoders.

x is split into two bf16 halves (hi + lo) inside the kernel, so each product carries about 16
bits of x: the bound is 1e-5 of Σ|x||w| (float32 accumulation alone is ~1e-6). At the
production precision (``split_x=False``) x is rounded once to bf16 and the same bound holds
against the product of the rounded x. Sizes are awkward
on purpose: rows not a multiple of the 64-row warp tile, K not a multiple of 128 (the row_split
padding), NVFP4 objects with one and with two divisors, activation counts on both sides of each
8-row tile, K split into slices whose partial sums the last block adds (run twice: the sums must
be bit-identical).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_runtime.backends.cuda import kernels

from .conftest import REPORT, requires_gpu
from .test_kernels import RS, case_id, make_weight

pytestmark = requires_gpu

CASES = [
    ("q4_g64_fp16", RS, (300, 200), 1),
    ("q5_g64_fp16", RS, (300, 200), 1),
    ("q6_g64_fp16", RS, (300, 200), 1),
    ("q8_g32_fp16", RS, (300, 200), 1),
    ("q4_g64_fp16", RS, (77, 1000), 1),
    ("q5_g64_fp16", RS, (1030, 520), 1),
    ("q8_g32_fp16", RS, (77, 1000), 1),
    ("bf16", "contiguous_le_v1", (300, 256), 1),
    ("bf16", "contiguous_le_v1", (70, 192), 1),
    ("nvfp4", "block_scale_k16_m128x4_v1", (384, 192), 1),
    ("nvfp4", "block_scale_k16_m128x4_v1", (512, 320), 2),  # two divisors, 256 rows each
]
TC_BOUND = 1e-5


def check(got: Any, x: np.ndarray, w: np.ndarray) -> float:
    import cupy as cp

    got = cp.asnumpy(got).astype(np.float64)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    bound = TC_BOUND * (np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T) + 1e-30
    assert np.all(np.isfinite(got))
    ratio = np.max(np.abs(got - ref) / bound)
    assert ratio <= 1.0, f"error {ratio:.2f}x the bound"
    return float(np.max(np.abs(got - ref) / (np.abs(ref).max() + 1e-30)))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_tile_and_split(case: Any) -> None:
    import cupy as cp

    parent, w = make_weight(case, seed=7)
    p = parent.planes
    assert kernels.max_rows(p) == kernels.MAX_SMALL_ROWS
    n, k = case[2]
    rng = np.random.default_rng(8)
    worst = 0.0
    for m in (1, 2, 5, 8, 9, 16, 23, 33, 64):
        x = rng.standard_normal((m, k)).astype(np.float32)
        padded = cp.zeros((m, p.x_width), dtype=cp.float32)
        padded[:, :k] = cp.asarray(x)
        nt = 1 << max(0, (m - 1).bit_length() - 3)
        for tiles in kernels.SMALL_TILES[nt]:
            for split in (1, 3, None):
                y = cp.full((m, n), np.nan, dtype=cp.float32)
                kernels.small_gemm(parent.data, p, 0, n, padded, y, n, tiles, split)
                worst = max(worst, check(y, x, w))
                again = cp.full((m, n), np.nan, dtype=cp.float32)
                kernels.small_gemm(parent.data, p, 0, n, padded, again, n, tiles, split)
                same = cp.array_equal(y, again)
                assert same, f"M={m} (R, U)={tiles} split={split}: not deterministic"
    REPORT.append((case_id(case), "tensor-core M=1..64 max rel err", f"{worst:.2e}"))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_production_precision(case: Any) -> None:
    """``split_x=False`` (the linear family's ``product_bf16``): one mma a tile on x rounded
    once to bf16, so the result is the product of the bf16-rounded x within the same
    accumulation bound; deterministic across K splits."""
    import cupy as cp

    parent, w = make_weight(case, seed=7)
    p = parent.planes
    n, k = case[2]
    rng = np.random.default_rng(18)
    for m in (1, 5, 8, 16, 33, 64):
        x = rng.standard_normal((m, k)).astype(np.float32)
        padded = cp.zeros((m, p.x_width), dtype=cp.float32)
        padded[:, :k] = cp.asarray(x)
        nt = 1 << max(0, (m - 1).bit_length() - 3)
        for tiles in kernels.SMALL_TILES[nt]:
            for split in (3, None):
                y = cp.full((m, n), np.nan, dtype=cp.float32)
                kernels.small_gemm(parent.data, p, 0, n, padded, y, n, tiles, split, split_x=False)
                check(y, _bf16(x), w)
                again = cp.full((m, n), np.nan, dtype=cp.float32)
                kernels.small_gemm(
                    parent.data, p, 0, n, padded, again, n, tiles, split, split_x=False
                )
                assert cp.array_equal(y, again), f"M={m} {tiles} split={split}: not deterministic"


@pytest.mark.parametrize("case", [CASES[0], CASES[7], CASES[-1]], ids=case_id)  # q4, bf16, nvfp4
def test_row_range_into_a_wider_output(case: Any) -> None:
    """Rows row0 .. row0+rows of the object land in a column slice of a wider output."""
    import cupy as cp

    parent, w = make_weight(case, seed=9)
    p = parent.planes
    n, k = case[2]
    row0, rows, width, col = 37, n - 50, n + 11, 5
    for m in (1, 8, 12):
        x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
        padded = cp.zeros((m, p.x_width), dtype=cp.float32)
        padded[:, :k] = cp.asarray(x)
        out = cp.full((m, width), 7.0, dtype=cp.float32)
        kernels.small_gemm(parent.data, p, row0, rows, padded, out[:, col:], width)
        check(out[:, col : col + rows], x, w[row0 : row0 + rows])
        untouched = cp.asnumpy(out)
        assert (untouched[:, :col] == 7).all() and (untouched[:, col + rows :] == 7).all()


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bf16 (to nearest, ties to even), as the grouped product takes x."""
    u = x.astype(np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


# one case of each tensor-core layout (rows: two experts of 150 / 192 / 256 rows, none a
# multiple of the 128- or 256-row block)
GROUP_CASES = [CASES[0], CASES[1], CASES[2], CASES[3], CASES[7], CASES[9], CASES[10]]


def _live_rows(m: int) -> np.ndarray:
    """Live rows of the five test groups: all, none (a group of expert -1), a partial first
    tile, one short of all, and a tile and a bit."""
    return np.array([m, 0, 5, m - 1, 17], dtype=np.int32)


def _computed(live: int, m: int) -> int:
    """The rows a group with ``live`` live rows writes: its whole 8-row tiles."""
    return min(m, -(-live // 8) * 8)


@pytest.mark.parametrize("case", GROUP_CASES, ids=case_id)
@pytest.mark.parametrize("config", kernels.GROUP_CONFIGS, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("live", [False, True], ids=["all-rows", "live-rows"])
def test_grouped_product(case: Any, config: tuple[int, int, int], live: bool) -> None:
    """``small_gemm_groups``: each group multiplies the bf16-rounded x rows it gathers (rows
    of -1 read zeros) by its expert's rows (two experts: the two halves of one object), a
    group of expert -1 writes nothing; with ``group_rows``, a group writes the 8-row tiles
    holding its live rows and nothing past them; bit-identical when run again."""
    import cupy as cp

    tiles = config[0]
    parent, w = make_weight(case, seed=11)
    p = parent.planes
    n, k = case[2]
    half = n // 2
    m = 8 * tiles
    group_expert = np.array([1, -1, 0, 1, 0], dtype=np.int32)
    rows = _live_rows(m) if live else None
    rng = np.random.default_rng(12)
    x = rng.standard_normal((40, k)).astype(np.float32)
    x_rows = rng.integers(-1, 40, size=group_expert.size * m).astype(np.int32)
    padded = cp.zeros((40, p.x_width), dtype=cp.float32)
    padded[:, :k] = cp.asarray(x)
    base = cp.asarray(np.full(2, parent.data.data.ptr, dtype=np.int64))
    row0 = cp.asarray(np.array([0, half], dtype=np.int32))
    args = (base, row0, cp.asarray(group_expert), p, half)
    runs = []
    for _ in range(2):
        y = cp.full((group_expert.size * m, half), np.nan, dtype=cp.float32)
        kernels.small_gemm_groups(
            *args, padded, y, half, cp.asarray(x_rows), None if rows is None else cp.asarray(rows),
            config=config,
        )  # fmt: skip
        runs.append(cp.asnumpy(y))
    assert np.array_equal(runs[0], runs[1], equal_nan=True), "not deterministic"
    xb = np.where(x_rows[:, None] >= 0, _bf16(x)[np.maximum(x_rows, 0)], 0.0)
    for g, e in enumerate(group_expert):
        got = runs[0][g * m : (g + 1) * m]
        done = m if rows is None else _computed(int(rows[g]), m)
        assert np.isnan(got[done:]).all()  # tiles past the live rows never written
        if e < 0:
            assert np.isnan(got).all()  # never written
            continue
        check(got[:done], xb[g * m : g * m + done], w[e * half : (e + 1) * half])


@pytest.mark.parametrize("case", GROUP_CASES, ids=case_id)
@pytest.mark.parametrize("config", kernels.GROUP_CONFIGS[:1] + kernels.GROUP_CONFIGS[-1:])
def test_grouped_gated_product(case: Any, config: tuple[int, int, int]) -> None:
    """``small_gemm_groups(gated=True)``: each expert's rows ``row0 .. row0 + rows`` are a
    gate and the next ``rows`` its up projection; the product writes ``silu(gate) * up``
    (as ``moe_silu_mul`` computes it) for the gathered bf16 x rows of the tiles holding each
    group's live rows, and nothing past ``rows`` of its output rows or past those tiles."""
    import cupy as cp

    tiles = config[0]
    parent, w = make_weight(case, seed=13)
    p = parent.planes
    n, k = case[2]
    rows = n // 4  # two experts of gate | up, each 2 * rows rows
    m = 8 * tiles
    group_expert = np.array([1, -1, 0, 1, 0], dtype=np.int32)
    live = _live_rows(m)
    rng = np.random.default_rng(14)
    x = rng.standard_normal((30, k)).astype(np.float32)
    x_rows = rng.integers(-1, 30, size=group_expert.size * m).astype(np.int32)
    padded = cp.zeros((30, p.x_width), dtype=cp.float32)
    padded[:, :k] = cp.asarray(x)
    base = cp.asarray(np.full(2, parent.data.data.ptr, dtype=np.int64))
    row0 = cp.asarray(np.array([0, 2 * rows], dtype=np.int32))
    width = rows + 5
    y = cp.full((group_expert.size * m, width), np.nan, dtype=cp.float32)
    kernels.small_gemm_groups(
        base, row0, cp.asarray(group_expert), p, rows, padded, y, width, cp.asarray(x_rows),
        cp.asarray(live), config=config, gated=True,
    )  # fmt: skip
    got = cp.asnumpy(y)
    xb = np.where(x_rows[:, None] >= 0, _bf16(x)[np.maximum(x_rows, 0)], 0.0).astype(np.float64)
    for g, e in enumerate(group_expert):
        block = got[g * m : (g + 1) * m]
        done = _computed(int(live[g]), m)
        assert np.isnan(block[:, rows:]).all()  # columns past the gate rows untouched
        assert np.isnan(block[done:]).all()  # tiles past the live rows untouched
        if e < 0:
            assert np.isnan(block).all()
            continue
        first = 2 * rows * e
        xg = xb[g * m : g * m + done]
        gate = xg @ w[first : first + rows].astype(np.float64).T
        up = xg @ w[first + rows : first + 2 * rows].astype(np.float64).T
        want = gate / (1 + np.exp(-gate)) * up
        np.testing.assert_allclose(
            block[:done, :rows], want, rtol=1e-4, atol=1e-4 * np.abs(want).max()
        )
