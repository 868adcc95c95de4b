"""The Gated DeltaNet decode kernels against the numpy reference (ops/delta_rule/).

Sizes are awkward on purpose: channel counts that are not multiples of the block, value
heads sharing key heads 1, 2 or 3 ways, head sizes 16..128 with a value size that does not
fill the 32-column tile, and slots a shuffled subset of the pool. The reference runs in
float64 on the same float32 inputs; untouched pool slots must come back bit-identical.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_runtime.backends.cuda import gdn
from ninfer_runtime.functional import l2_normalize
from ninfer_runtime.ops.delta_rule import conv as C
from ninfer_runtime.ops.delta_rule import reference as R

from .conftest import requires_gpu

pytestmark = requires_gpu

TAPS = 4
STEPS = 3


def f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def pick_slots(rng: np.random.Generator, n: int, pool: int) -> np.ndarray:
    return rng.permutation(pool)[:n].astype(np.int32)


def ref_silu(y: np.ndarray) -> np.ndarray:
    return y * 0.5 * (1 + np.tanh(0.5 * y))


def ref_gdn(
    qkv: np.ndarray, g: Any, beta: Any, states: np.ndarray, slots: Any, hk: int, dk: int, hv: int
) -> np.ndarray:
    """``gdn.gdn_step`` in float64: split, normalise, then ``gdn_step_slots`` (updates
    ``states``)."""
    n = qkv.shape[0]
    q, k, v = np.split(qkv.astype(np.float64), [hk * dk, 2 * hk * dk], axis=-1)
    q = l2_normalize(q.reshape(n, hk, dk)) * dk**-0.5
    k = l2_normalize(k.reshape(n, hk, dk))
    v = v.reshape(n, hv, -1)
    return R.step_slots(q, k, v, g.astype(np.float64), beta.astype(np.float64), states, slots)


def assert_close(got: Any, ref: np.ndarray, what: str) -> None:
    import cupy as cp

    got = cp.asnumpy(got).astype(np.float64)
    assert np.all(np.isfinite(got)), what
    scale = float(np.abs(ref).max()) + 1e-30
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * scale, err_msg=what)


def assert_untouched(after: Any, before: np.ndarray, slots: np.ndarray, what: str) -> None:
    import cupy as cp

    keep = np.setdiff1d(np.arange(before.shape[0]), slots)
    got = cp.asnumpy(after)[keep]
    assert np.array_equal(got.view(np.uint32), before[keep].view(np.uint32)), what


@pytest.mark.parametrize("silu", [True, False])
@pytest.mark.parametrize(("n", "channels", "pool"), [(1, 70, 3), (3, 300, 5), (8, 1000, 11)])
def test_conv_step(n: int, channels: int, pool: int, silu: bool) -> None:
    import cupy as cp

    rng = np.random.default_rng(n * 1000 + channels)
    kernel = f32(rng, TAPS, channels, scale=0.5)
    ref_states = f32(rng, pool, channels, TAPS - 1)
    states = cp.asarray(ref_states)
    for step in range(STEPS):
        x, slots = f32(rng, n, channels), pick_slots(rng, n, pool)
        before = cp.asnumpy(states)
        y = gdn.conv_step(cp.asarray(x), cp.asarray(kernel), states, cp.asarray(slots), silu=silu)
        ref = C.conv_step(x.astype(np.float64), kernel.astype(np.float64), ref_states, slots)
        assert_close(y, ref_silu(ref) if silu else ref, f"y, step {step}")
        # the state update is a shift of float32 values: exact
        assert np.array_equal(cp.asnumpy(states), ref_states), f"conv_states, step {step}"
        assert_untouched(states, before, slots, f"untouched conv_states, step {step}")


GDN_CASES = [
    # (N, key heads, value heads, dk, dv, pool)
    (1, 1, 1, 16, 16, 2),
    (3, 2, 6, 32, 16, 5),
    (8, 1, 2, 128, 128, 10),
    (5, 3, 3, 64, 32, 7),
    (2, 2, 4, 16, 128, 4),
    (4, 1, 3, 128, 48, 6),
    (7, 2, 4, 32, 64, 9),
]


@pytest.mark.parametrize(
    ("n", "hk", "hv", "dk", "dv", "pool"),
    GDN_CASES,
    ids=[f"n{c[0]}-h{c[1]}x{c[2]}-dk{c[3]}-dv{c[4]}" for c in GDN_CASES],
)
def test_gdn_step(n: int, hk: int, hv: int, dk: int, dv: int, pool: int) -> None:
    import cupy as cp

    rng = np.random.default_rng(n * 100 + hv * 10 + dk + dv)
    ref_states = f32(rng, pool, hv, dk, dv, scale=0.3).astype(np.float64)
    states = cp.asarray(ref_states.astype(np.float32))
    for step in range(STEPS):
        qkv = f32(rng, n, 2 * hk * dk + hv * dv)
        g = -rng.uniform(0.01, 2.0, (n, hv)).astype(np.float32)
        beta = rng.uniform(0.0, 1.0, (n, hv)).astype(np.float32)
        slots = pick_slots(rng, n, pool)
        before = cp.asnumpy(states)
        o = gdn.gdn_step(
            *map(cp.asarray, (qkv, g, beta)),
            states,
            cp.asarray(slots),
            key_heads=hk,
            key_dim=dk,
            value_heads=hv,
            value_dim=dv,
        )
        assert o.shape == (n, hv, dv)
        ref = ref_gdn(qkv, g, beta, ref_states, slots, hk, dk, hv)
        assert_close(o, ref, f"o, step {step}")
        assert_close(states, ref_states, f"states, step {step}")
        assert_untouched(states, before, slots, f"untouched states, step {step}")


def test_validation() -> None:
    import cupy as cp

    x = cp.zeros((2, 40), dtype=cp.float32)
    kernel = cp.zeros((TAPS, 40), dtype=cp.float32)
    conv_states = cp.zeros((3, 40, TAPS - 1), dtype=cp.float32)
    slots = cp.zeros(2, dtype=cp.int32)
    with pytest.raises(ValueError, match="conv_states"):
        gdn.conv_step(x, kernel, conv_states[:, :, :2], slots)
    with pytest.raises(ValueError, match="slots"):
        gdn.conv_step(x, kernel, conv_states, slots.astype(cp.int64))
    with pytest.raises(ValueError, match=r"^x: .*not C-contiguous"):
        gdn.conv_step(x[:, ::2], kernel, conv_states, slots)
    dims = dict(key_heads=1, key_dim=16, value_heads=1, value_dim=8)
    states = cp.zeros((3, 1, 16, 8), dtype=cp.float32)
    g = cp.zeros((2, 1), dtype=cp.float32)
    qkv = cp.zeros((2, 2 * 16 + 8), dtype=cp.float32)
    with pytest.raises(ValueError, match=r"^qkv"):
        gdn.gdn_step(qkv[:, :-1], g, g, states, slots, **dims)
    with pytest.raises(ValueError, match=r"^states"):
        gdn.gdn_step(qkv, g, g, states[:, :, :, :4], slots, **dims)
    with pytest.raises(ValueError, match="key_dim"):
        gdn.gdn_step(x, g, g, states, slots, **{**dims, "key_dim": 12})


def test_graph_replay() -> None:
    """Both launches captured once in a CUDA graph, replayed with new inputs and slots."""
    import cupy as cp

    n, hk, hv, dk, dv, pool = 4, 1, 2, 128, 96, 9
    channels = 2 * hk * dk + hv * dv
    dims = dict(key_heads=hk, key_dim=dk, value_heads=hv, value_dim=dv)
    rng = np.random.default_rng(7)
    kernel = cp.asarray(f32(rng, TAPS, channels, scale=0.5))
    ref_conv = f32(rng, pool, channels, TAPS - 1)
    ref_states = f32(rng, pool, hv, dk, dv, scale=0.3).astype(np.float64)
    conv_pool, state_pool = cp.asarray(ref_conv), cp.asarray(ref_states.astype(np.float32))
    x = cp.zeros((n, channels), dtype=cp.float32)
    g = cp.zeros((n, hv), dtype=cp.float32)
    beta = cp.zeros((n, hv), dtype=cp.float32)
    slots = cp.zeros(n, dtype=cp.int32)

    def step(conv_states: Any, states: Any) -> tuple[Any, Any]:
        y = gdn.conv_step(x, kernel, conv_states, slots)
        return y, gdn.gdn_step(y, g, beta, states, slots, **dims)

    # compile and load the module, and warm the memory pool, outside the capture
    step(cp.zeros_like(conv_pool), cp.zeros_like(state_pool))
    cp.cuda.Device().synchronize()

    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        y, o = step(conv_pool, state_pool)  # keep both referenced while the graph lives
        graph = s.end_capture()

    for replay in range(2):
        x_np = f32(rng, n, channels)
        g_np = -rng.uniform(0.01, 2.0, (n, hv)).astype(np.float32)
        beta_np = rng.uniform(0.0, 1.0, (n, hv)).astype(np.float32)
        slots_np = pick_slots(rng, n, pool)
        for arr, value in ((x, x_np), (g, g_np), (beta, beta_np), (slots, slots_np)):
            arr.set(value, stream=s)
        graph.launch(s)
        s.synchronize()

        conv = C.conv_step(x_np.astype(np.float64), cp.asnumpy(kernel), ref_conv, slots_np)
        conv = ref_silu(conv)
        ref_o = ref_gdn(conv, g_np, beta_np, ref_states, slots_np, hk, dk, hv)
        assert_close(y, conv, f"y, replay {replay}")
        assert_close(o, ref_o, f"o, replay {replay}")
        assert np.array_equal(cp.asnumpy(conv_pool), ref_conv), f"conv_states, replay {replay}"
        assert_close(state_pool, ref_states, f"states, replay {replay}")
