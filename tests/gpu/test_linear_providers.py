"""Each provider of the linear family's ``product`` against the family's oracle
(``ops/linear/reference.py``: the stored bytes decoded by the format's codec, multiplied in
float32 on the host), forced one at a time with ``registry.override`` and resolved from the
key the CUDA backend builds: a row range starting inside a 16-row tile written into a column
slice of a wider output, M on both sides of the GEMV's 8 rows. The bound is the provider's
``TOLERANCE`` plus the reference's, of each output's magnitudes Σ_k |x_k| |W_rk|; a provider
that declines the layout (tensor cores on NF4 or FP8, tiles on anything but row_split
q4/q5/q8) is skipped by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_runtime.ops import registry
from ninfer_runtime.ops.linear import product_key
from ninfer_runtime.ops.linear import reference as oracle
from tests.runtime.test_linear_reference import RS, stored

from .conftest import requires_gpu

pytestmark = requires_gpu

CASES = [
    ("q4_g64_fp16", RS, (300, 200), 1),
    ("q5_g64_fp16", RS, (77, 1000), 1),
    ("q8_g32_fp16", RS, (300, 200), 1),
    ("nf4_g64_fp16", RS, (300, 200), 1),
    ("nvfp4", "block_scale_k16_m128x4_v1", (512, 320), 2),
    ("fp8_e4m3fn_row_bf16", "row_scale_v1", (300, 208), 1),
    ("bf16", "contiguous_le_v1", (300, 256), 1),
]
PROVIDERS = ("gemv", "tensor_cores", "tiles")
ROWS = (1, 3, 8, 9, 64)


def on_device(name: str, raw: np.ndarray, p: Any) -> tuple[Any, Any]:
    """The object's bytes and planes as the provider reads them (tile packed for ``tiles``)."""
    import cupy as cp

    from ninfer_runtime.backends.cuda import tiles

    data = cp.asarray(raw)
    if name != "tiles":
        return data, p
    if p.code not in tiles.TILED_CODES:
        pytest.skip(f"tiles: format code {p.code} is never tile packed")
    return tiles.pack_tiles(cp, data, p.code, p.rows, p.columns), tiles.tiled_planes(
        p.code, p.rows, p.columns
    )


@pytest.mark.parametrize("name", PROVIDERS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2][0]}x{c[2][1]}")
def test_provider_matches_the_reference(case: tuple, name: str) -> None:
    import cupy as cp

    raw, p, w = stored(case, seed=4)
    data, planes = on_device(name, raw, p)
    k = p.columns
    row0, rows = 3, p.rows - 5
    part = np.abs(w[row0 : row0 + rows]).astype(np.float64)
    provider = registry.providers("linear")["product"][name]
    rng = np.random.default_rng(5)
    ran = []
    for m in ROWS:
        key = product_key(planes, rows, m)
        if not provider.takes(key):
            continue
        with registry.override("linear", "product", name):
            product = registry.resolve("linear", "product", **key)
        x = np.zeros((m, planes.x_width), np.float32)  # as the backend pads it
        x[:, :k] = rng.standard_normal((m, k))
        wide = cp.full((m, rows + 7), np.nan, dtype=cp.float32)
        product(data, planes, row0, rows, cp.asarray(x), wide[:, 2:], rows + 7)
        got = cp.asnumpy(wide)
        want = np.empty((m, rows), np.float32)
        oracle.product(raw, p, row0, rows, x, want, rows)
        tolerance = oracle.TOLERANCE[name] + oracle.TOLERANCE["reference"]
        bound = tolerance * (np.abs(x[:, :k]).astype(np.float64) @ part.T) + 1e-30
        error = np.abs(got[:, 2 : 2 + rows].astype(np.float64) - want)
        assert np.all(error <= bound), f"{name} M={m}: {np.max(error / bound):.2f}x the bound"
        assert np.isnan(got[:, :2]).all() and np.isnan(got[:, 2 + rows :]).all()
        ran.append(m)
    if not ran:
        pytest.skip(f"{name} declines {case[0]}")
