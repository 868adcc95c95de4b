"""The bf16 prefill product (``backends/cuda/prefill.py``) against numpy oracles.

* the operands are exact: ``to_bf16`` and ``gemv.dequant_rows`` into uint16 give, bit for bit,
  ``ninfer_format.numeric.f32_to_bf16`` of x and of the numpy decoder's weights;
* the product is the float64 product of those bf16 operands within float32 accumulation
  error (a tight bound), and the float32 product within bf16 rounding of the inputs;
* the output goes into a column slice of a wider array (cuBLAS ldc = the full row width) and
  nothing outside the slice changes; slabs, segments out of order and bf16 weights read in
  place with an odd K all land in the right columns.

Shapes are odd on purpose: M not a multiple of 16 (and M = 1, 3: shapes no GEMV serves take
this path too), N and K odd, K = 3 x 128 where the format wants multiples of 64. The cuBLAS
operand arithmetic (``gemm_operands``) is also checked on any machine, against a column-major
GEMM emulated in numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_format.numeric import bf16_to_f32, f32_to_bf16
from ninfer_runtime.backends.cuda import kernels, prefill

from .conftest import REPORT, requires_gpu
from .test_kernels import make_weight

RS = "row_split_k128_v1"
NVFP4 = "block_scale_k16_m128x4_v1"
CASES = [
    # (format, layout, [N, K], divisors)
    ("q4_g64_fp16", RS, (300, 200), 1),
    ("q4_g64_fp16", RS, (77, 1000), 1),
    ("q5_g64_fp16", RS, (131, 385), 1),
    ("q6_g64_fp16", RS, (131, 385), 1),
    ("q8_g32_fp16", RS, (300, 200), 1),
    ("q8_g32_fp16", RS, (131, 384), 1),
    ("nf4_g64_fp16", RS, (131, 385), 1),
    ("nvfp4", NVFP4, (384, 384), 1),
    ("nvfp4", NVFP4, (512, 320), 2),
    ("fp8_e4m3fn_row_bf16", "row_scale_v1", (300, 208), 1),
    ("fp8_e4m3fn_row_bf16", "row_scale_v1", (131, 385), 1),  # no GEMV: M <= 8 comes here too
    ("bf16", "contiguous_le_v1", (300, 200), 1),
    ("bf16", "contiguous_le_v1", (131, 385), 1),  # in place, rows not 4-byte aligned
]
#: activation rows: past the GEMV (9), not multiples of 16 (21, 133), and 1, 3 (the product
#: serves them where no GEMV reads the shape)
ROWS = (1, 3, 9, 21, 133)
#: float32 accumulation of exact bf16 x bf16 products, relative to sum |x||w|
TIGHT = 1e-5
#: bf16 rounding of x and of the weights: each product within 2 * 2^-9 (+ accumulation)
BF16_BOUND = 4e-3


def on_gpu(fn: Any) -> Any:
    """The ``gpu`` mark and the skip where CuPy or a device is missing (tests above run on any
    machine)."""
    for mark in requires_gpu:
        fn = mark(fn)
    return fn


def case_id(case: tuple[str, str, tuple[int, int], int]) -> str:
    fmt, _, (n, k), d = case
    return f"{fmt}-{n}x{k}" + (f"-d{d}" if d > 1 else "")


def bf16_round(a: np.ndarray) -> np.ndarray:
    return bf16_to_f32(f32_to_bf16(np.asarray(a, dtype=np.float32)))


def ratio(got: np.ndarray, ref: np.ndarray, x: np.ndarray, w: np.ndarray, rel: float) -> float:
    """max |got - ref| over ``rel * (|x| |w|ᵀ)``: at most 1 passes."""
    bound = rel * (np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T) + 1e-30
    assert np.all(np.isfinite(got))
    return float(np.max(np.abs(got.astype(np.float64) - ref) / bound))


def check_product(got: Any, x: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """got vs the product of the bf16-rounded operands (tight) and the float32 product."""
    import cupy as cp

    got = cp.asnumpy(got)
    xb, wb = bf16_round(x), bf16_round(w)
    exact_b = xb.astype(np.float64) @ wb.astype(np.float64).T
    exact_32 = x.astype(np.float64) @ w.astype(np.float64).T
    tight = ratio(got, exact_b, xb, wb, TIGHT)
    loose = ratio(got, exact_32, x, w, BF16_BOUND)
    assert tight <= 1.0, f"error {tight:.2f}x the float32-accumulation bound"
    assert loose <= 1.0, f"error {loose:.2f}x the bf16 bound against the float32 product"
    return tight, float(np.max(np.abs(got - exact_32)) / (np.abs(exact_32).max() + 1e-30))


@pytest.fixture(scope="module")
def bf16_backend() -> Any:
    from ninfer_runtime.backends.cuda.backend import CudaBackend

    return CudaBackend(prefill_precision="bf16")


# ------------------------------------------------------------------- any machine
def colmajor_gemm(
    ops: tuple[int, int, int, int, int, int, int, int],
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
) -> None:
    """BLAS ``C = op(A) op(B)`` on flat column-major buffers (alpha 1, beta 0)."""
    transa, transb, m, n, k, lda, ldb, ldc = ops
    i, j, p = np.arange(m)[:, None, None], np.arange(n)[None, :, None], np.arange(k)
    op_a = a[p * lda + i] if transa == prefill.CUBLAS_OP_N else a[i * lda + p]  # [m, 1, k]
    op_b = b[j * ldb + p] if transb == prefill.CUBLAS_OP_N else b[p * ldb + j]  # [1, n, k]
    c[(i + j * ldc)[..., 0]] = np.sum(op_a * op_b, axis=-1)


@pytest.mark.parametrize("m", [1, 3, 21])
@pytest.mark.parametrize(("n", "k", "width", "col"), [(7, 5, 7, 0), (13, 9, 40, 11), (1, 3, 6, 5)])
def test_gemm_operands_column_major(m: int, n: int, k: int, width: int, col: int) -> None:
    """The cuBLAS call gemm_bf16 makes, emulated: y = x wᵀ lands in the column slice."""
    rng = np.random.default_rng(m * 100 + n)
    w, x = rng.standard_normal((n, k)), rng.standard_normal((m, k))
    out = np.full((m, width), np.nan)
    y_strides = (out.strides[0] // 2, out.strides[1] // 2)  # float32 strides of y = out[:, col:]
    ops = prefill.gemm_operands(n, k, m, y_strides)
    assert ops[:2] == (prefill.CUBLAS_OP_T, prefill.CUBLAS_OP_N)
    flat = out.reshape(-1)[col:]  # C's pointer: the slice's first element
    colmajor_gemm(ops, w.reshape(-1), x.reshape(-1), flat)
    np.testing.assert_allclose(out[:, col : col + n], x @ w.T, rtol=1e-12, atol=1e-12)
    outside = np.ones(width, bool)
    outside[col : col + n] = False
    assert np.all(np.isnan(out[:, outside]))


@pytest.mark.parametrize(
    ("rows", "most"), [(34816, 26214), (100, 200), (1000, 130), (9000, 100), (256, 256)]
)
def test_slabs_cover_the_weight_in_aligned_equal_parts(rows: int, most: int) -> None:
    slab = prefill.slab_rows(rows, most)
    if rows <= most:
        assert slab == rows
        return
    starts = range(0, rows, slab)
    assert all(a % prefill.SLAB_ALIGN == 0 for a in starts)  # each slab's column slice aligned
    assert slab <= max(most, prefill.SLAB_ALIGN)  # fits the scratch (at least one aligned slab)
    # as few slabs as an aligned slab size allows, and no tiny remainder beyond rounding
    assert len(starts) == -(-rows // slab) <= -(-rows // max(most // 128 * 128, 128))


def test_gemm_operands_reject_non_slices() -> None:
    with pytest.raises(ValueError):
        prefill.gemm_operands(8, 4, 3, (16, 4))  # rows closer than N
    with pytest.raises(ValueError):
        prefill.gemm_operands(8, 4, 3, (64, 8))  # columns not adjacent


def test_precision_from_env() -> None:
    assert prefill.precision_from_env({}) == "bf16"
    for value in prefill.PRECISIONS:
        assert prefill.precision_from_env({prefill.ENV: value.upper()}) == value
    with pytest.raises(ValueError, match=prefill.ENV):
        prefill.precision_from_env({prefill.ENV: "fp16"})


# ------------------------------------------------------------------------ on a GPU
@on_gpu
def test_to_bf16_matches_numpy() -> None:
    import cupy as cp

    rng = np.random.default_rng(0)
    values = rng.standard_normal(7 * 143) * np.exp(rng.uniform(-80, 80, 7 * 143))
    bits = rng.integers(0, 1 << 32, 4000, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 1 << 16, 200, dtype=np.uint64).astype(np.uint32) << 16) | 0x8000
    special = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-40, 3.4028235e38, -3.4028235e38],
        dtype=np.float32,
    )
    nan_low = np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0x7FA00000], np.uint32)
    parts = [values.astype(np.float32), bits.view(np.float32), ties.view(np.float32), special]
    x = np.concatenate([*parts, nan_low.view(np.float32)])
    got = cp.asnumpy(prefill.to_bf16(cp.asarray(x)))
    assert np.array_equal(got, f32_to_bf16(x))
    shaped = x[: 7 * 143].reshape(7, 143)
    got2 = cp.asnumpy(prefill.to_bf16(cp.asarray(shaped)))
    assert got2.shape == shaped.shape and np.array_equal(got2, f32_to_bf16(shaped))
    whole = cp.asarray(x)
    for a, b in ((0, 5212), (4, 5212), (1, 5213), (8, 8)):  # four a thread; misaligned; none
        got3 = cp.asnumpy(prefill.to_bf16(whole[a:b]))
        assert np.array_equal(got3, f32_to_bf16(x[a:b])), (a, b)


@on_gpu
def test_to_bf16_random_bit_patterns() -> None:
    import cupy as cp

    rng = np.random.default_rng(4)
    bits = rng.integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), rng.standard_normal(1000).astype(np.float32)])
    got = cp.asnumpy(prefill.to_bf16(cp.asarray(x.reshape(-1, 8))))
    np.testing.assert_array_equal(got.reshape(-1), f32_to_bf16(x))


@on_gpu
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_dequant_rows_bf16_is_bit_exact(case: Any) -> None:
    import cupy as cp

    parent, w = make_weight(case, seed=10)
    n, k = case[2]
    rows = np.array([n - 1, 0, 5, 5, n // 2, *range(17, min(n, 60))], dtype=np.int32)
    out = cp.empty((len(rows), k), dtype=cp.uint16)
    kernels.dequant_rows(parent.data, parent.planes, cp.asarray(rows), out)
    assert np.array_equal(cp.asnumpy(out), f32_to_bf16(w[rows]))
    if prefill.is_bf16(parent.planes):
        view = prefill.bf16_rows(parent.data, parent.planes, 37, n - 40)
        assert np.array_equal(cp.asnumpy(view), f32_to_bf16(w[37 : n - 3]))


@on_gpu
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_bf16_product(case: Any, bf16_backend: Any) -> None:
    """``linear`` with bf16 prefill products, every M, against both oracles."""
    import cupy as cp

    from ninfer_runtime.backends.cuda.weights import PackedWeight, Segment

    parent, w = make_weight(case, seed=11)
    n, k = case[2]
    weight = PackedWeight([Segment(parent, 0, n)], (n, k))
    rng = np.random.default_rng(12)
    worst_tight, worst_rel = 0.0, 0.0
    for m in ROWS:
        x = (rng.standard_normal((m, k)) * np.exp(rng.uniform(-2, 2, (m, 1)))).astype(np.float32)
        if m <= kernels.max_rows(parent.planes):
            # a small-M kernel serves these rows in linear: call the product directly
            y = cp.empty((m, n), dtype=cp.float32)
            bf16_backend._dequant_matmul(cp.asarray(x), Segment(parent, 0, n), y)
        else:
            y = bf16_backend.linear(cp.asarray(x), weight)
        tight, rel = check_product(y, x, w)
        worst_tight, worst_rel = max(worst_tight, tight), max(worst_rel, rel)
    REPORT.append((case_id(case), "bf16 GEMM err / tight bound", f"{worst_tight:.2f}"))
    REPORT.append((case_id(case), "bf16 GEMM rel err vs float32", f"{worst_rel:.2e}"))


@on_gpu
@pytest.mark.parametrize("m", [1, 21, 133])
def test_gemm_writes_a_column_slice(m: int) -> None:
    """gemm_bf16 into columns [c0, c0 + n) of a wider NaN-filled output."""
    import cupy as cp

    rng = np.random.default_rng(m)
    n, k, width, c0 = 131, 385, 300, 77
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    out = cp.full((m, width), cp.nan, dtype=cp.float32)
    wb = cp.asarray(f32_to_bf16(w))
    prefill.gemm_bf16(wb, prefill.to_bf16(cp.asarray(x)), out[:, c0 : c0 + n])
    host = cp.asnumpy(out)
    check_product(host[:, c0 : c0 + n], x, w)
    assert np.all(np.isnan(host[:, :c0])) and np.all(np.isnan(host[:, c0 + n :]))


@on_gpu
@pytest.mark.parametrize("case", [CASES[0], CASES[7], CASES[9]], ids=case_id)
def test_slabs_and_segments(case: Any, bf16_backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small slabs (each a column slice of the output, filled on the side stream into the two
    buffers in turn) and two out-of-order row ranges of one parent, the second starting
    mid-object, as one weight."""
    import cupy as cp

    from ninfer_runtime.backends.cuda.slabs import SlabBuffers
    from ninfer_runtime.backends.cuda.weights import PackedWeight, Segment

    parent, w = make_weight(case, seed=13)
    n, k = case[2]
    # buffers of 130 rows: 128-row slabs, the first segment in two of them
    monkeypatch.setattr(bf16_backend, "_slabs", SlabBuffers(2 * k * 130))
    a, b = (37, n - 80), (n - 40, 40)
    weight = PackedWeight([Segment(parent, *b), Segment(parent, *a)], (a[1] + b[1], k))
    rows = np.r_[np.arange(b[0], b[0] + b[1]), np.arange(a[0], a[0] + a[1])]
    rows_x = kernels.MAX_SMALL_ROWS + 6  # past every small-M kernel
    for seed in (14, 15, 16):  # back to back: each fill waits for the product before it
        x = np.random.default_rng(seed).standard_normal((rows_x, k)).astype(np.float32)
        check_product(bf16_backend.linear(cp.asarray(x), weight), x, w[rows])


@on_gpu
@pytest.mark.parametrize("case", [CASES[1], CASES[7], CASES[11]], ids=case_id)
def test_gated_linear_is_the_product_of_silu_up(case: Any, bf16_backend: Any) -> None:
    """The dense MLP's down projection with SiLU·up written as the GEMM's bf16 operand: for
    prefill rows the values ``linear`` gives for the kernel's bf16 words as float32 (whose
    rounding to bf16 leaves them as they are; the words are checked in
    test_glue_kernels.py), and the small-M product of silu_mul's rows for a few rows."""
    import cupy as cp

    from ninfer_runtime.backends.cuda import glue
    from ninfer_runtime.backends.cuda.weights import PackedWeight, Segment
    from ninfer_runtime.functional import silu_mul

    parent, _ = make_weight(case, seed=17)
    n, k = case[2]
    weight = PackedWeight([Segment(parent, 0, n)], (n, k))
    for m in (3, kernels.MAX_SMALL_ROWS + 6):
        gu = np.random.default_rng(m).standard_normal((m, 2 * k)).astype(np.float32)
        got = cp.asnumpy(bf16_backend.gated_linear(cp.asarray(gu), weight))
        if m > kernels.max_rows(parent.planes):
            h = bf16_to_f32(cp.asnumpy(glue.silu_mul_bf16(cp.asarray(gu))))
        else:  # the small-M product of silu_mul's float32 rows
            h = silu_mul(gu[:, :k], gu[:, k:])
        want = cp.asnumpy(bf16_backend.linear(cp.asarray(h), weight))
        assert np.allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@on_gpu
@pytest.mark.parametrize("precision", ["tf32", "float32"])
def test_float32_scratch_modes(precision: str) -> None:
    """tf32 and float32 keep the float32 scratch + cuBLAS path (float32 holds its bound)."""
    import cupy as cp

    from ninfer_runtime.backends.cuda.backend import CudaBackend
    from ninfer_runtime.backends.cuda.weights import PackedWeight, Segment

    backend = CudaBackend(prefill_precision=precision)
    parent, w = make_weight(CASES[0], seed=15)
    n, k = CASES[0][2]
    x = np.random.default_rng(16).standard_normal((kernels.MAX_SMALL_ROWS + 6, k))
    x = x.astype(np.float32)
    got = cp.asnumpy(backend.linear(cp.asarray(x), PackedWeight([Segment(parent, 0, n)], (n, k))))
    rel = 2e-6 if precision == "float32" else 2e-3  # TF32: inputs to 10 mantissa bits
    assert ratio(got, x.astype(np.float64) @ w.astype(np.float64).T, x, w, rel) <= 1.0
    with pytest.raises(ValueError):
        CudaBackend(prefill_precision="fp16")


@on_gpu
@pytest.mark.parametrize("lo_slot", [0, 1, 2])
def test_split_tf32_is_exact(lo_slot: int) -> None:
    import cupy as cp

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((7, 429)) * np.exp(rng.uniform(-30, 30, (7, 429)))).astype(np.float32)
    got = cp.asnumpy(prefill.split_tf32(cp.asarray(x), lo_slot))
    assert got.shape == (7, 3 * 429)
    slots = [got[:, s * 429 : (s + 1) * 429] for s in range(3)]
    lo = slots[lo_slot]
    hi, *others = [slots[s] for s in range(3) if s != lo_slot]
    assert all(np.array_equal(o, hi) for o in others)
    assert np.all(hi.view(np.uint32) & 0x1FFF == 0)  # 10 mantissa bits
    assert np.array_equal(hi.astype(np.float64) + lo, x.astype(np.float64))
    assert np.all(np.abs(lo) <= np.abs(x) * 2.0**-11)
    with pytest.raises(ValueError):
        prefill.split_tf32(cp.asarray(x), 3)


@on_gpu
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (37, 257, 2048), (2048, 33, 129), (5, 0, 8)])
def test_matmul_3xtf32_is_about_float32(m: int, n: int, k: int) -> None:
    """The router's product: within a bound plain TF32 (10 mantissa bits) would miss."""
    import cupy as cp

    rng = np.random.default_rng(m + n + k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    w_split = prefill.split_tf32(cp.asarray(w), 0)
    got = cp.asnumpy(prefill.matmul_3xtf32(cp.asarray(x), w_split))
    assert got.shape == (m, n)
    if got.size:
        ref = x.astype(np.float64) @ w.astype(np.float64).T
        assert ratio(got, ref, x, w, 2e-6) <= 1
