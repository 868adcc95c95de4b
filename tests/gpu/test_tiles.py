"""The tile kernels (``kernels/tiles.cu``) over tile-packed objects against the numpy decoders.

x enters as two halves (hi + lo: bf16 for q4, ~16 bits; fp16 for q5 and q8, ~22 bits, each
row scaled by a power of two into fp16's range), so products are bounded like the tensor-core
kernel's (1e-5 of sum |x||w|); rows of x spread over e^-9 .. e^9 check that scaling. Shapes
are awkward on purpose: rows not a multiple of the 16-row tile, K not a multiple of 128 or of
four groups, row ranges that start inside a tile (a Q|K|V segment), K split into slices whose
partial sums the last block adds (run twice: the sums must be bit-identical), M on both sides
of the 4-row block.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_format.codecs import codec_for
from ninfer_format.codecs.gguf_blocks import LAYOUT
from ninfer_runtime.backends.cuda import formats as F
from ninfer_runtime.backends.cuda import kernels, tile_products, tiles, weights
from tests.format.test_codecs_gguf import _random_blocks
from tests.gguf_terms import term_magnitudes

from . import test_backend
from .conftest import requires_gpu
from .test_kernels import RS, case_id, check_close, make_weight, product

pytestmark = requires_gpu

Q4_K, Q5_K, Q6_K, IQ2 = "gguf_q4_k", "gguf_q5_k", "gguf_q6_k", "gguf_iq2_xxs"
CASES = [
    ("q4_g64_fp16", RS, (300, 200), 1),
    ("q5_g64_fp16", RS, (300, 200), 1),
    ("q8_g32_fp16", RS, (300, 200), 1),
    (Q4_K, LAYOUT, (300, 512), 1),
    (Q5_K, LAYOUT, (300, 512), 1),
    (Q6_K, LAYOUT, (300, 512), 1),
    (IQ2, LAYOUT, (300, 512), 1),
    ("q4_g64_fp16", RS, (77, 1000), 1),
    ("q5_g64_fp16", RS, (1030, 520), 1),
    ("q8_g32_fp16", RS, (77, 1000), 1),
    (Q4_K, LAYOUT, (77, 1024), 1),
    (Q5_K, LAYOUT, (77, 1024), 1),
    (Q6_K, LAYOUT, (77, 1024), 1),
    (IQ2, LAYOUT, (77, 1024), 1),
    ("q4_g64_fp16", RS, (64, 8192), 1),  # few long rows: K split into many slices
    ("q5_g64_fp16", RS, (40, 6000), 1),
    (Q4_K, LAYOUT, (40, 6144), 1),
    (Q5_K, LAYOUT, (40, 6144), 1),
    (Q6_K, LAYOUT, (40, 6144), 1),
    (IQ2, LAYOUT, (40, 6144), 1),
]
#: one of each format
FIRST = CASES[:7]


def tiled(case: Any, seed: int = 0) -> tuple[Any, F.Planes, np.ndarray, np.ndarray]:
    """The tile-packed object, its planes, its values and the magnitudes its products sum
    (q4_k, q5_k: scale and min parts apart, as their GEMV's bound)."""
    import cupy as cp

    fmt, layout, shape, _ = case
    if fmt in (Q4_K, Q5_K, Q6_K, IQ2):  # random blocks (gguf has no encoder for these)
        blocks = _random_blocks(fmt, shape[0] * shape[1] // 256, seed)
        stored = cp.asarray(blocks.reshape(-1))
        w = codec_for(fmt, layout).decode(blocks.reshape(-1), shape)
        terms = term_magnitudes(fmt, blocks, shape)
    else:
        parent, w = make_weight(case, seed)
        stored, terms = parent.data, np.abs(w).astype(np.float64)
    code = F.planes(fmt, layout, shape).code
    data = tiles.pack_tiles(cp, stored, code, *shape)
    return data, tiles.tiled_planes(code, *shape), w, terms


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_product(case: Any) -> None:
    import cupy as cp

    data, p, w, terms = tiled(case, seed=5)
    n, k = case[2]
    rng = np.random.default_rng(1)
    for m in (1, 3, 4, 5, 8):
        x = rng.standard_normal((m, k)) * np.exp(rng.uniform(-9, 9, (m, 1)))
        x = x.astype(np.float32)
        xp = cp.zeros((m, p.x_width), dtype=cp.float32)
        xp[:, :k] = cp.asarray(x)
        for split in (None, 1, 5):
            y = cp.full((m, n), np.nan, dtype=cp.float32)
            tile_products.product(data, p, 0, n, xp, y, n, split=split)
            check_close(y, x, w, tensor_cores=True, terms=terms)
            again = cp.full((m, n), np.nan, dtype=cp.float32)
            tile_products.product(data, p, 0, n, xp, again, n, split=split)
            assert cp.array_equal(y, again), "the K-split sums are not deterministic"


#: formats whose fragments are fp16 (x scaled by a power of two a row, then rounded to fp16)
HALF = {"q5_g64_fp16", "q8_g32_fp16"}
#: production x against exact x on fp16 formats: fp16's unit roundoff 2^-11 of each |x w|,
#: plus float32 accumulation
HALF_REL = 2**-11 + 1e-5


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_production_product(case: Any) -> None:
    """x rounded once (``split_x=False``, the production precision): on the bf16 formats the
    result is the product of bf16-rounded x (round to nearest even) within the split kernel's
    accumulation bound (1e-5 of the magnitudes); on the fp16 formats the exact product within
    fp16's rounding of x. Deterministic across K splits, as the split kernel."""
    import cupy as cp

    from ninfer_runtime.kv_storage import from_bf16_words, to_bf16_words

    data, p, w, terms = tiled(case, seed=5)
    n, k = case[2]
    rng = np.random.default_rng(1)
    for m in (1, 3, 5, 8):
        x = rng.standard_normal((m, k)) * np.exp(rng.uniform(-9, 9, (m, 1)))
        x = x.astype(np.float32)
        xp = cp.zeros((m, p.x_width), dtype=cp.float32)
        xp[:, :k] = cp.asarray(x)
        for split in (None, 5):
            y = cp.full((m, n), np.nan, dtype=cp.float32)
            tile_products.product(data, p, 0, n, xp, y, n, split=split, split_x=False)
            got = cp.asnumpy(y).astype(np.float64)
            assert np.all(np.isfinite(got))
            if case[0] in HALF:
                rounded, rel = x.astype(np.float64), HALF_REL
            else:
                rounded, rel = from_bf16_words(to_bf16_words(x)).astype(np.float64), 1e-5
            ref = rounded @ w.astype(np.float64).T
            bound = rel * (np.abs(rounded) @ terms.T) + 1e-30
            ratio = float(np.max(np.abs(got - ref) / bound))
            assert ratio <= 1.0, f"m={m} split={split}: error {ratio:.2f}x the bound"
            again = cp.full((m, n), np.nan, dtype=cp.float32)
            tile_products.product(data, p, 0, n, xp, again, n, split=split, split_x=False)
            assert cp.array_equal(y, again), "the K-split sums are not deterministic"


def test_rows_in_parts_where_the_partial_sums_do_not_fit(monkeypatch: Any) -> None:
    """More rows than the K slices' partial sums have room for (a 248,320-row head at eight
    rows) run a part of the rows at a time: here a buffer of 4,096 floats, 4 slices of 8
    rows, so 128 rows a part."""
    import cupy as cp

    from ninfer_runtime.backends.cuda import split_sums

    case = ("q4_g64_fp16", RS, (300, 2048), 1)
    data, p, w, terms = tiled(case, seed=3)
    monkeypatch.setattr(split_sums, "PARTIAL_FLOATS", 4096)
    x = np.random.default_rng(4).standard_normal((8, 2048)).astype(np.float32)
    y = cp.full((8, 300), np.nan, dtype=cp.float32)
    tile_products.product(data, p, 0, 300, cp.asarray(x), y, 300, split=5)
    check_close(y, x, w, True, terms)


@pytest.mark.parametrize("case", FIRST, ids=case_id)
def test_row_ranges_and_wider_output(case: Any) -> None:
    """Rows 21 .. n - 7 into columns of a wider y (ldy > rows), through the linear family's
    ``product``, and 13 activation rows (two launches of 8 and 5)."""
    import cupy as cp

    data, p, w, terms = tiled(case, seed=9)
    n, k = case[2]
    rng = np.random.default_rng(2)
    for m in (2, 13):
        x = rng.standard_normal((m, k)).astype(np.float32)
        xp = cp.zeros((m, p.x_width), dtype=cp.float32)
        xp[:, :k] = cp.asarray(x)
        r0, rows = 21, n - 28
        out = cp.full((m, n + 10), np.nan, dtype=cp.float32)
        product(data, p, r0, rows, xp, out[:, 3:], n + 10)
        check_close(out[:, 3 : 3 + rows], x, w[r0 : r0 + rows], True, terms[r0 : r0 + rows])
        assert cp.isnan(out[:, :3]).all() and cp.isnan(out[:, 3 + rows :]).all()


@pytest.mark.parametrize("case", CASES[:14], ids=case_id)
def test_decode_rows(case: Any) -> None:
    """Rows to float32 and to bf16 words (prefill slabs, the embedding), in any order."""
    import cupy as cp

    data, p, w, _ = tiled(case, seed=11)
    n, k = case[2]
    rows = np.array([n - 1, 0, 17, 16, 5, n // 2], dtype=np.int32)
    out = cp.empty((rows.size, k), dtype=cp.float32)
    kernels.dequant_rows(data, p, cp.asarray(rows), out)
    np.testing.assert_array_equal(cp.asnumpy(out), w[rows])
    words = cp.empty((rows.size, k), dtype=cp.uint16)
    kernels.dequant_rows(data, p, cp.asarray(rows), words)
    bits = w[rows].astype(np.float32).view(np.uint32)
    want = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(cp.asnumpy(words), want)


def test_packing_on_the_device_matches_numpy() -> None:
    import cupy as cp

    parent, _ = make_weight(("q5_g64_fp16", RS, (77, 1000), 1), seed=3)
    p = parent.planes
    on_device = tiles.pack_tiles(cp, parent.data, p.code, p.rows, p.columns)
    on_host = tiles.pack_tiles(np, cp.asnumpy(parent.data), p.code, p.rows, p.columns)
    np.testing.assert_array_equal(cp.asnumpy(on_device), on_host)


@pytest.mark.parametrize("kind", ["dense", "moe"])
@pytest.mark.parametrize("recipe", ["tiny_q4", "tiny_mixed"])
def test_engine_with_every_tiled_object_packed(
    recipe: str, kind: str, gpu_artifact: Any, monkeypatch: Any
) -> None:
    """The engine against the CPU reference (``test_backend``'s check: logits, greedy tokens)
    with the tiny models' q4/q5/q8 objects tile packed as the loader packs large ones (q8: the
    embedding's rows too)."""
    monkeypatch.setattr(weights, "PACK_FROM_WEIGHTS", 0)
    calls = []
    product = tile_products.product
    monkeypatch.setattr(
        tile_products, "product", lambda *a, **k: calls.append(1) or product(*a, **k)
    )
    test_backend.test_matches_cpu_reference(recipe, True, "float32", "float32", kind, gpu_artifact)
    assert calls, "no product ran on the tile kernel"
