"""Each packed-layout kernel against the numpy decoder (the format's oracle) on random data.

Shapes are awkward on purpose: K not a multiple of 128 (row_split pads rows, x is padded to
match), N not a multiple of the 16-row block, row views that start inside a 128-row NVFP4
scale tile, and every activation count M = 1..8 of the GEMV plus a prefill-sized M.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_format.codecs import codec_for
from ninfer_runtime.backends.cuda import formats as F
from ninfer_runtime.backends.cuda import kernels
from ninfer_runtime.backends.cuda.weights import PackedWeight, Parent, Segment
from ninfer_runtime.ops import registry
from ninfer_runtime.ops.linear import product_key

from .conftest import REPORT, requires_gpu

pytestmark = requires_gpu

RS = "row_split_k128_v1"
CASES = [
    # (format, layout, [N, K], divisors)
    ("q4_g64_fp16", RS, (300, 200), 1),
    ("q5_g64_fp16", RS, (300, 200), 1),
    ("q6_g64_fp16", RS, (300, 200), 1),
    ("q8_g32_fp16", RS, (300, 200), 1),
    ("nf4_g64_fp16", RS, (300, 200), 1),
    ("q4_g64_fp16", RS, (77, 1000), 1),
    ("q8_g32_fp16", RS, (77, 1000), 1),
    ("nvfp4", "block_scale_k16_m128x4_v1", (384, 192), 1),
    ("nvfp4", "block_scale_k16_m128x4_v1", (512, 320), 2),
    ("fp8_e4m3fn_row_bf16", "row_scale_v1", (300, 208), 1),
    ("fp8_e4m3fn_row_bf16", "row_scale_v1", (300, 200), 1),  # K % 16: dequantize path
    ("bf16", "contiguous_le_v1", (300, 200), 1),
    ("bf16", "contiguous_le_v1", (70, 130), 1),  # K % 8: dequantize path
]


def case_id(case: tuple[str, str, tuple[int, int], int]) -> str:
    fmt, _, (n, k), d = case
    return f"{fmt}-{n}x{k}" + (f"-d{d}" if d > 1 else "")


def make_weight(case: tuple[str, str, tuple[int, int], int], seed: int = 0) -> tuple[Any, Any]:
    """A resident packed weight from random values, and its decoded values (the oracle)."""
    import cupy as cp

    fmt, layout, shape, divisors = case
    rng = np.random.default_rng(seed)
    # rows of very different magnitudes exercise the per-group / per-row scales
    values = rng.standard_normal(shape) * np.exp(rng.uniform(-3, 3, (shape[0], 1)))
    codec = codec_for(fmt, layout)
    raw = np.frombuffer(codec.encode(values.astype(np.float32), divisors), dtype=np.uint8)
    decoded = codec.decode(raw, shape, divisors)
    parent = Parent("test", cp.asarray(raw), F.planes(fmt, layout, shape, divisors))
    return parent, decoded


def check_close(
    got: Any,
    x: np.ndarray,
    w: np.ndarray,
    tensor_cores: bool = False,
    terms: np.ndarray | None = None,
) -> float:
    """|got - x wᵀ| within float32 accumulation error of the magnitudes involved (``terms``:
    those of a kernel that sums w's parts apart, else |w|); products on the tensor-core
    kernel carry x as two bf16 halves (~16 bits): a 1e-5 bound there."""
    import cupy as cp

    got = cp.asnumpy(got).astype(np.float64)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    rel = 1e-5 if tensor_cores else 2e-6
    magnitudes = np.abs(w).astype(np.float64) if terms is None else terms
    bound = rel * (np.abs(x).astype(np.float64) @ magnitudes.T) + 1e-30
    assert np.all(np.isfinite(got))
    ratio = np.max(np.abs(got - ref) / bound)
    assert ratio <= 1.0, f"error {ratio:.2f}x the float32 bound"
    return float(np.max(np.abs(got - ref) / (np.abs(ref).max() + 1e-30)))


def product(data: Any, p: Any, row0: int, rows: int, x: Any, y: Any, ldy: int) -> None:
    """The linear family's ``product`` as the backend calls it: the provider its policy picks
    for these planes, rows and activation rows."""
    key = product_key(p, rows, int(x.shape[0]))
    registry.resolve("linear", "product", **key)(data, p, row0, rows, x, y, ldy)


def on_tensor_cores(parent: Any, m: int) -> bool:
    return m <= kernels.max_rows(parent.planes) and kernels.has_tensor_cores(parent.planes)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_gemv_every_lane_count(case: Any, cuda_backend: Any) -> None:
    import cupy as cp

    parent, w = make_weight(case)
    n, k = case[2]
    weight = PackedWeight([Segment(parent, 0, n)], (n, k))
    rng = np.random.default_rng(1)
    worst = 0.0
    for m in range(1, 9):
        x = rng.standard_normal((m, k)).astype(np.float32)
        got = cuda_backend.linear(cp.asarray(x), weight)
        worst = max(worst, check_close(got, x, w, on_tensor_cores(parent, m)))
    if parent.planes.gemv:  # every compiled (M, rows per warp, K split), not just defaults
        for m, r, ks in kernels.GEMV_CONFIGS:
            x = rng.standard_normal((m, k)).astype(np.float32)
            padded = np.zeros((m, parent.planes.x_width), np.float32)
            padded[:, :k] = x
            y = cp.empty((m, n), dtype=cp.float32)
            kernels.gemv(
                parent.data,
                parent.planes,
                0,
                n,
                cp.asarray(padded),
                y,
                n,
                rows_per_warp=r,
                k_split=ks,
            )
            worst = max(worst, check_close(y, x, w))
    REPORT.append((case_id(case), "GEMV M=1..8 max rel err", f"{worst:.2e}"))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_row_views_and_segments(case: Any, cuda_backend: Any) -> None:
    """Two row ranges of one parent, out of order and starting mid-tile, as one weight."""
    import cupy as cp

    parent, w = make_weight(case, seed=2)
    n, k = case[2]
    a, b = (37, min(100, n - 40)), (n - 40, 40)
    weight = PackedWeight([Segment(parent, *b), Segment(parent, *a)], (a[1] + b[1], k))
    rows = np.r_[np.arange(b[0], b[0] + b[1]), np.arange(a[0], a[0] + a[1])]
    rng = np.random.default_rng(3)
    for m in (1, 3, 8, 21):  # 21: the tensor-core kernel, 8-row GEMVs or dequantize + cuBLAS
        x = rng.standard_normal((m, k)).astype(np.float32)
        got = cuda_backend.linear(cp.asarray(x), weight)
        check_close(got, x, w[rows], on_tensor_cores(parent, m))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_verification_rows_stay_on_the_small_m_kernels(
    case: Any, cuda_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """9..64 rows (a speculative verification: lanes x (drafts + 1)) on every layout a GEMV
    reads run the small-M kernels, never the dequantize + GEMM path: the tensor-core kernel,
    or the GEMV 8 rows at a time, each 8 rows exactly what one GEMV launch of them gives."""
    import cupy as cp

    parent, w = make_weight(case, seed=8)
    n, k = case[2]
    weight = PackedWeight([Segment(parent, 0, n)], (n, k))
    p = parent.planes
    if p.gemv:

        def refused(*args: Any) -> None:
            raise AssertionError("a verification-sized product took the dequantize path")

        monkeypatch.setattr(cuda_backend, "_dequant_matmul", refused)
    rng = np.random.default_rng(9)
    for m in (9, 16, 21, 48, 64):
        x = rng.standard_normal((m, k)).astype(np.float32)
        got = cuda_backend.linear(cp.asarray(x), weight)
        check_close(got, x, w, on_tensor_cores(parent, m))
        if p.gemv and not kernels.has_tensor_cores(p):
            for a in range(0, m, kernels.MAX_GEMV_ROWS):
                alone = cuda_backend.linear(cp.asarray(x[a : a + kernels.MAX_GEMV_ROWS]), weight)
                assert np.array_equal(
                    cp.asnumpy(got[a : a + kernels.MAX_GEMV_ROWS]), cp.asnumpy(alone)
                )


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_dequantize_is_bit_exact(case: Any, cuda_backend: Any) -> None:
    import cupy as cp

    parent, w = make_weight(case, seed=4)
    n, k = case[2]
    weight = PackedWeight([Segment(parent, 0, n)], (n, k))
    assert np.array_equal(cp.asnumpy(cuda_backend.array(weight)), w)
    ids = np.array([n - 1, 0, 5, 5, n // 2])
    assert np.array_equal(cp.asnumpy(cuda_backend.embedding(cp.asarray(ids), weight)), w[ids])


def test_prefill_sized_m(cuda_backend: Any) -> None:
    import cupy as cp

    case = CASES[0]
    parent, w = make_weight(case, seed=5)
    n, k = case[2]
    weight = PackedWeight([Segment(parent, 0, n)], (n, k))
    x = np.random.default_rng(6).standard_normal((133, k)).astype(np.float32)
    check_close(cuda_backend.linear(cp.asarray(x), weight), x, w)
