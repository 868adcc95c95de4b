"""benchmarks/product_kinds.py: the kernels gpu_bench.py times take any 1..64 activation rows
the way the engine gives them to each kernel (plain Python: the launches are recorded, no GPU
needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ninfer_runtime.backends.cuda import formats as F
from ninfer_runtime.backends.cuda import kernels, tile_products
from tests.benchmarks import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def load_kinds():
    return load_benchmark("product_kinds")


@pytest.fixture
def launches(monkeypatch) -> list[tuple[str, int]]:
    """(kernel, activation rows) of every launch, instead of launching."""
    seen: list[tuple[str, int]] = []

    def gemv(data, p, row0, rows, x, y, ldy, **_):
        # the rows-per-warp choice the real launcher makes first (a KeyError beyond 8 rows)
        kernels.default_rows_per_warp(p.code, x.shape[0], rows, 1)
        seen.append(("simt", x.shape[0]))

    def small_gemm(data, p, row0, rows, x, y, ldy, *_, split_x=True):
        seen.append(("tc" if split_x else "tc_bf16", x.shape[0]))

    def tiles(data, p, row0, rows, x, y, ldy, *_, split_x=True):
        assert p.tiled
        seen.append(("tiles" if split_x else "tiles_bf16", x.shape[0]))

    monkeypatch.setattr(kernels, "gemv", gemv)
    monkeypatch.setattr(kernels, "small_gemm", small_gemm)
    monkeypatch.setattr(tile_products, "product", tiles)
    return seen


def run(bench, p: F.Planes, m: int, seen: list) -> dict[str, list[tuple[str, int]]]:
    out = {}
    for kind in bench.kinds(p):
        q = bench.planes_for(kind, p)
        x = np.zeros((m, q.x_width), dtype=np.float32)
        y = np.zeros((m, q.rows), dtype=np.float32)
        seen.clear()
        bench.launcher(kind, q)(None, x, y)
        out[kind] = list(seen)
    return out


def test_sixteen_rows_take_the_tensor_cores_and_eight_row_launches_elsewhere(launches):
    bench = load_kinds()
    p = F.planes("q4_g64_fp16", "row_split_k128_v1", (17408, 5120))  # a 27B MLP gate|up
    assert run(bench, p, 16, launches) == {
        "product": [("tc", 16)],  # what the engine runs for 16 lanes on the stored layout
        "simt": [("simt", 8), ("simt", 8)],
        "tc": [("tc", 16)],
        "tc_bf16": [("tc_bf16", 16)],
        "tiles": [("tiles", 8), ("tiles", 8)],  # the loader's tile-packed copy
        "tiles_bf16": [("tiles_bf16", 8), ("tiles_bf16", 8)],  # x rounded once
    }


def test_layouts_without_tensor_cores_run_sixteen_rows_as_two_gemv_launches(launches):
    bench = load_kinds()
    p = F.planes("nf4_g64_fp16", "row_split_k128_v1", (5120, 17408))
    assert run(bench, p, 16, launches) == {"product": [("simt", 8), ("simt", 8)]}


def test_eight_rows_and_fewer_keep_one_launch(launches):
    bench = load_kinds()
    p = F.planes("q8_g32_fp16", "row_split_k128_v1", (5120, 17408))
    assert run(bench, p, 8, launches)["simt"] == [("simt", 8)]
    assert run(bench, p, 1, launches)["tiles"] == [("tiles", 1)]


def test_row_counts_beyond_the_small_kernels_are_refused_in_one_line():
    bench = load_kinds()
    bench.check_rows((1, 8, 16, 64))
    with pytest.raises(ValueError, match=r"^--rows 0,65: the small-M kernels take 1\.\.64 "):
        bench.check_rows((0, 8, 65))
