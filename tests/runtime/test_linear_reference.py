"""The linear family's oracle (``ops/linear/reference.py``): the CPU device's ``product``
resolves to it, and it computes ``x · W[row0 : row0 + rows]ᵀ`` of the object's decoded values
into a view of a wider output, for every kind of layout the kernels read (per-group scales,
two NVFP4 divisors, per-row scales, bf16 words, ggml blocks), x wider than the object (the
kernels' zero padding) and awkward shapes."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_format.codecs import codec_for
from ninfer_runtime.backends.cuda import formats as F
from ninfer_runtime.ops import registry
from ninfer_runtime.ops.linear import product_key
from ninfer_runtime.ops.linear.reference import TOLERANCE

RS = "row_split_k128_v1"
GGUF = "gguf_blocks_v1"
#: (format, layout, [N, K], divisors)
CASES = [
    ("q4_g64_fp16", RS, (40, 200), 1),
    ("nf4_g64_fp16", RS, (33, 130), 1),
    ("q8_g32_fp16", RS, (40, 200), 1),
    ("nvfp4", "block_scale_k16_m128x4_v1", (256, 128), 2),
    ("fp8_e4m3fn_row_bf16", "row_scale_v1", (30, 208), 1),
    ("bf16", "contiguous_le_v1", (30, 130), 1),
    ("gguf_q8_0", GGUF, (24, 256), 1),
    ("gguf_q4_0", GGUF, (24, 256), 1),
]


def stored(case: tuple, seed: int = 0) -> tuple[np.ndarray, F.Planes, np.ndarray]:
    """The object's bytes, its planes and its values as the codec decodes them."""
    fmt, layout, shape, divisors = case
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape) * np.exp(rng.uniform(-3, 3, (shape[0], 1)))
    codec = codec_for(fmt, layout)
    raw = np.frombuffer(codec.encode(values.astype(np.float32), divisors), dtype=np.uint8)
    return raw, F.planes(fmt, layout, shape, divisors), codec.decode(raw, shape, divisors)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2][0]}x{c[2][1]}")
def test_the_reference_is_the_decoded_product(case: tuple) -> None:
    raw, p, w = stored(case)
    n, k = case[2]
    row0, rows, m = 3, n - 5, 3
    product = registry.resolve("linear", "product", **product_key(p, rows, m, device="cpu"))
    assert product is registry.providers("linear")["product"]["reference"].load()
    rng = np.random.default_rng(1)
    x = np.zeros((m, p.x_width + 4), np.float32)  # columns past K: padding, never read
    x[:, :k] = rng.standard_normal((m, k))
    x[:, k:] = np.nan
    wide = np.full((m, rows + 7), np.nan, np.float32)
    product(raw, p, row0, rows, x, wide[:, 2:], wide.shape[1])
    got = wide[:, 2 : 2 + rows].astype(np.float64)
    part = w[row0 : row0 + rows].astype(np.float64)
    want = x[:, :k].astype(np.float64) @ part.T
    bound = TOLERANCE["reference"] * (np.abs(x[:, :k]).astype(np.float64) @ np.abs(part).T)
    assert np.all(np.abs(got - want) <= bound + 1e-30)
    assert np.isnan(wide[:, :2]).all() and np.isnan(wide[:, 2 + rows :]).all()  # untouched


def test_a_tile_packed_object_is_declined() -> None:
    _, p, _ = stored(CASES[0])
    key = product_key(p, p.rows, 1, device="cpu") | {"tiled": True}
    with pytest.raises(LookupError, match="no provider"):
        registry.resolve("linear", "product", **key)
