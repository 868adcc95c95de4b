"""The glue kernels (kernels/glue.cu) against numpy: the residual add fused into RMSNorm.

Widths are awkward on purpose (1, below a warp, around the 256-thread block, not a multiple of
anything) and the weight takes both offsets (1: Qwen3.5's zero-centred norms, 0: plain). The
fused kernel must also give exactly the values of the add followed by ``rms_norm``, the pair of
launches it replaces in a decode step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_runtime.backends.cuda import glue
from ninfer_runtime.ops import registry

from .conftest import requires_gpu

pytestmark = requires_gpu

EPS = 1e-6
SHAPES = [
    (1, 1),
    (3, 31),
    (8, 255),
    (8, 256),
    (5, 257),
    (2, 1000),
    (8, 4099),
    (65, 2048),
    (1, 5120),  # a decode step's hidden row: the long-row kernel's float4 path
    (3, 8196),  # more than 1024 float4s a row: threads take a second turn
]


def oracle(h: np.ndarray, delta: np.ndarray, w: np.ndarray, offset: float) -> np.ndarray:
    s = h.astype(np.float64) + delta
    return s / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + EPS) * (w + offset)


def inputs(shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    h = (rng.standard_normal(shape) * np.exp(rng.uniform(-4, 4, (*shape[:-1], 1)))).astype(
        np.float32
    )
    delta = rng.standard_normal(shape).astype(np.float32)
    w = (rng.standard_normal(shape[-1]) * 0.2).astype(np.float32)
    return h, delta, w


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_add_rms_norm_matches_numpy(
    shape: tuple[int, int], offset: float, cuda_backend: Any
) -> None:
    import cupy as cp

    h, delta, w = inputs(shape, shape[-1])
    add_rms_norm = registry.resolve("norm", "add_rms_norm", device=cuda_backend.name)
    s, y = add_rms_norm(cp.asarray(h), cp.asarray(delta), cp.asarray(w), EPS, offset=offset)
    np.testing.assert_array_equal(cp.asnumpy(s), h + delta)
    ref = oracle(h, delta, w, offset)
    scale = np.abs(ref).max(axis=-1, keepdims=True) + 1e-30
    assert np.all(np.abs(cp.asnumpy(y) - ref) <= 2e-6 * scale + 1e-6 * np.abs(ref))


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("shape", [(8, 257), (3, 4, 1000), (65, 2048)])
def test_add_rms_norm_equals_the_add_then_the_norm(shape: tuple[int, ...], offset: float) -> None:
    import cupy as cp

    h, delta, w = (cp.asarray(a) for a in inputs(shape, 7))
    s, y = glue.add_rms_norm(h, delta, w, EPS, offset)
    assert s.shape == y.shape == shape and s.dtype == y.dtype == cp.float32
    expected = glue.rms_norm(h + delta, w, EPS, offset)
    np.testing.assert_array_equal(cp.asnumpy(s), cp.asnumpy(h + delta))
    np.testing.assert_array_equal(cp.asnumpy(y), cp.asnumpy(expected))


def test_add_rms_norm_takes_strided_inputs_and_leaves_them_alone() -> None:
    import cupy as cp

    h, delta, w = inputs((6, 300), 3)
    wide = cp.asarray(np.concatenate([delta, delta], axis=1))[:, 1:301]  # not contiguous
    h_d = cp.asarray(h)
    s, y = glue.add_rms_norm(h_d, wide, cp.asarray(w), EPS, 1.0)
    shifted = np.concatenate([delta, delta], axis=1)[:, 1:301]
    np.testing.assert_array_equal(cp.asnumpy(h_d), h)
    np.testing.assert_array_equal(cp.asnumpy(s), h + shifted)
    np.testing.assert_array_equal(
        cp.asnumpy(y), cp.asnumpy(glue.rms_norm(cp.asarray(h + shifted), cp.asarray(w), EPS, 1.0))
    )


@pytest.mark.parametrize("d", [1028, 5120, 4099])
def test_long_rows_take_a_weight_view_at_any_alignment(d: int) -> None:
    """A weight that starts 4 bytes into its allocation (a view into packed weights) cannot be
    read four floats at a time: the kernels must see that and still give the same values."""
    import cupy as cp

    h, delta, w = inputs((2, d), d)
    packed = cp.asarray(np.concatenate([np.zeros(1, np.float32), w]))
    view = packed[1:]
    assert view.data.ptr % 16 == 4
    s, y = glue.add_rms_norm(cp.asarray(h), cp.asarray(delta), view, EPS, 1.0)
    ref = oracle(h, delta, w, 1.0)
    scale = np.abs(ref).max(axis=-1, keepdims=True) + 1e-30
    assert np.all(np.abs(cp.asnumpy(y) - ref) <= 2e-6 * scale + 1e-6 * np.abs(ref))
    np.testing.assert_array_equal(
        cp.asnumpy(y), cp.asnumpy(glue.rms_norm(s, view, EPS, 1.0)), strict=True
    )


def test_add_rms_norm_with_no_rows() -> None:
    import cupy as cp

    empty = cp.zeros((0, 64), cp.float32)
    s, y = glue.add_rms_norm(empty, empty, cp.ones(64, cp.float32), EPS, 1.0)
    assert s.shape == y.shape == (0, 64)


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 128), (7, 2, 33), (2, 3, 1100), (0, 4, 128)])
def test_gated_rms_norm_matches_numpy(shape: tuple[int, int, int], cuda_backend: Any) -> None:
    """Gated DeltaNet's output norm, its gate a column slice of a wider array (as the layer's
    projections give it), against float64: silu(gate) * rms_norm(x) * w."""
    import cupy as cp

    t, heads, d = shape
    rng = np.random.default_rng(d)
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-4, 4, (t, heads, 1)))).astype(np.float32)
    wide = (rng.standard_normal((t, heads * d + 9)) * 3).astype(np.float32)
    w = (rng.standard_normal(d) * 0.2).astype(np.float32)
    gate_d = cp.asarray(wide)[:, 5 : 5 + heads * d].reshape(t, heads, d)  # rows not contiguous
    gated_rms_norm = registry.resolve("norm", "gated_rms_norm", device=cuda_backend.name)
    y = cp.asnumpy(gated_rms_norm(cp.asarray(x), gate_d, cp.asarray(w), EPS))
    gate = wide[:, 5 : 5 + heads * d].reshape(t, heads, d).astype(np.float64)
    xs = x.astype(np.float64)
    normed = xs / np.sqrt(np.mean(xs * xs, axis=-1, keepdims=True) + EPS) * w
    ref = gate / (1 + np.exp(-gate)) * normed
    assert y.shape == shape and y.dtype == np.float32
    scale = np.abs(ref).max(axis=-1, keepdims=True) + 1e-30 if ref.size else 1.0
    assert np.all(np.abs(y - ref) <= 4e-6 * scale + 2e-6 * np.abs(ref))


@pytest.mark.parametrize("shape", [(1, 2), (3, 74), (5, 2048), (130, 8200), (0, 8)])
def test_silu_mul_bf16_matches_numpy(shape: tuple[int, int]) -> None:
    """The gated MLP's SiLU·up as bf16 words: the reference's float32 arithmetic (tanh-form
    sigmoid) rounded to bf16, within one bf16 step where the device's tanhf and numpy's may
    differ in the last float32 bit (gates above -8: below, 1 + tanh cancels and one bit of
    tanh is a large part of the tiny result); and near float64 SiLU·up everywhere. The quad
    path (half-width a multiple of 4) and the element path (37)."""
    import cupy as cp

    from ninfer_format.numeric import bf16_to_f32, f32_to_bf16
    from ninfer_runtime.functional import silu_mul

    rng = np.random.default_rng(shape[1])
    gu = (rng.standard_normal(shape) * 4).astype(np.float32)
    got = cp.asnumpy(glue.silu_mul_bf16(cp.asarray(gu)))
    inter = shape[1] // 2
    assert got.shape == (shape[0], inter) and got.dtype == np.uint16
    want = f32_to_bf16(silu_mul(gu[:, :inter], gu[:, inter:]))
    g, u = gu[:, :inter].astype(np.float64), gu[:, inter:]
    steps = np.abs(got.astype(np.int32) - want.astype(np.int32))[g > -8]
    assert steps.max(initial=0) <= 1 and np.sum(steps) <= 0.01 * steps.size
    err = np.abs(bf16_to_f32(got) - g / (1 + np.exp(-g)) * u)
    assert np.all(err <= 2.0**-7 * np.abs(g * u)), np.max(err / (np.abs(g * u) + 1e-30))
    with pytest.raises(ValueError):
        glue.silu_mul_bf16(cp.zeros((2, 3), cp.float32))


@pytest.mark.parametrize("aligned", [True, False])
def test_copy_ranges_moves_each_range_in_one_launch(aligned: bool) -> None:
    """Ranges of 16-byte words (the wide path) and of odd bytes, some longer than a block
    sweeps, against the same copies on the host; bytes between ranges stay as they were."""
    import cupy as cp

    rng = np.random.default_rng(1)
    src = cp.asarray(rng.integers(0, 255, 1 << 20, dtype=np.uint8))
    dst = cp.zeros(1 << 20, dtype=cp.uint8)
    starts = np.array([0, 4096, 200_000, 500_000])
    sizes = np.array([16, 160_000, 48, 300_000]) if aligned else np.array([7, 160_001, 45, 3])
    offsets_src = starts + (0 if aligned else 3)
    glue.copy_ranges(dst.data.ptr + starts, src.data.ptr + offsets_src, sizes)
    want = np.zeros(1 << 20, dtype=np.uint8)
    host = cp.asnumpy(src)
    for a, b, n in zip(starts, offsets_src, sizes, strict=True):
        want[a : a + n] = host[b : b + n]
    assert np.array_equal(cp.asnumpy(dst), want)


def test_a_snapshot_layout_on_the_device_equals_the_host_one() -> None:
    """The pool's snapshot copy on CuPy arrays (one launch) leaves the same bytes as on
    numpy arrays, keeping and restoring."""
    import cupy as cp

    from ninfer_runtime.snapshots import SnapshotLayout

    from ..runtime.test_snapshot_layout import arrays

    host_pages, host_states = arrays()
    dev_pages, dev_states = arrays(cp)
    host = SnapshotLayout(host_pages, host_states)
    dev = SnapshotLayout(dev_pages, dev_states)
    for layout in (host, dev):
        layout.copy([(1, (4, 0, 2))], restore=False)
    assert all(np.array_equal(cp.asnumpy(d), h) for d, h in zip(dev_pages, host_pages, strict=True))
    for states in (host_states, dev_states):
        for s in states:
            s[0] = 0
    for layout in (host, dev):
        layout.copy([(0, (4, 0, 2))], restore=True, states={1, 2})
    assert all(
        np.array_equal(cp.asnumpy(d), h) for d, h in zip(dev_states, host_states, strict=True)
    )


@pytest.mark.parametrize(
    ("shape", "iterations"), [((1, 4, 4), 20), ((300, 4, 4), 20), ((7, 2, 2), 1), ((3, 8, 8), 5)]
)
def test_sinkhorn_matches_the_reference(shape: tuple[int, ...], iterations: int) -> None:
    """The norm family's ``sinkhorn`` in one launch (a thread a matrix) against the reference
    in float64 on the same float32 logits, within the family's ``nvrtc`` tolerance; a matrix
    wider than the kernel's is refused in one line."""
    import cupy as cp

    from ninfer_runtime.ops.norm import nvrtc, reference
    from ninfer_runtime.ops.norm.reference import TOLERANCE

    logits = (np.random.default_rng(shape[0]).standard_normal(shape) * 3).astype(np.float32)
    got = cp.asnumpy(nvrtc.sinkhorn(cp.asarray(logits), iterations=iterations, eps=EPS))
    want = reference.sinkhorn(logits.astype(np.float64), iterations=iterations, eps=EPS)
    rtol, atol = TOLERANCE["nvrtc"]
    assert got.shape == shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    with pytest.raises(ValueError, match="sinkhorn"):
        glue.sinkhorn(cp.zeros((1, 9, 9), cp.float32), 2, EPS)
