"""The chunked Gated DeltaNet form (``ops/delta_rule/reference.py``: ``chunk``) against the
recurrent one (``step``) token by token, and against the earlier chunk-at-a-time
implementation kept here as an oracle: outputs, the final state, float32 throughout, and the
state updated in place through a view."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_runtime.functional import l2_normalize
from ninfer_runtime.ops.delta_rule import reference as R

TOL = 2e-5
HK, DK, DV = 2, 16, 16


def old_gdn_chunk(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any) -> Any:
    """The chunk-by-chunk implementation that ``chunk`` replaced (two solves a chunk)."""
    q, k, v, g, beta = R.heads_major(q, k, v, g, beta)
    t = v.shape[1]
    out = np.empty_like(v)
    for a in range(0, t, R.CHUNK):
        b = min(a + R.CHUNK, t)
        out[:, a:b] = _old_one_chunk(
            q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], state
        )
    return out.transpose(1, 0, 2)


def _old_one_chunk(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any) -> Any:
    c = v.shape[1]
    gamma = np.cumsum(g, axis=-1)
    causal = np.tri(c, c, 0, dtype=bool)
    span = np.where(causal, gamma[:, :, None] - gamma[:, None, :], np.float32(-np.inf))
    decay = np.exp(span)
    kk = k @ k.transpose(0, 2, 1)
    strictly_lower = np.tri(c, c, -1, dtype=bool)
    a = np.where(strictly_lower, beta[:, :, None] * kk * decay, np.float32(0))
    system = np.eye(c, dtype=np.float32) + a
    u = np.linalg.solve(system, beta[:, :, None] * v)
    w = np.linalg.solve(system, (beta * np.exp(gamma))[:, :, None] * k)
    v_new = u - w @ state
    out = (q * np.exp(gamma)[:, :, None]) @ state + ((q @ k.transpose(0, 2, 1)) * decay) @ v_new
    last = gamma[:, -1]
    tail = np.exp(last[:, None] - gamma)[:, :, None] * k
    state *= np.exp(last)[:, None, None]
    state += tail.transpose(0, 2, 1) @ v_new
    return out


def inputs(t: int, hv: int, seed: int) -> tuple[Any, ...]:
    """Random inputs as the model makes them: q, k l2-normalised (q scaled), g in [-3, 0],
    beta in [0, 1], a nonzero initial state; all float32."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    q = l2_normalize(rng.standard_normal((t, HK, DK)).astype(f32)) * f32(DK**-0.5)
    k = l2_normalize(rng.standard_normal((t, HK, DK)).astype(f32))
    v = rng.standard_normal((t, hv, DV)).astype(f32)
    g = rng.uniform(-3.0, 0.0, (t, hv)).astype(f32)
    beta = rng.uniform(0.0, 1.0, (t, hv)).astype(f32)
    state = (0.5 * rng.standard_normal((hv, DK, DV))).astype(f32)
    return q, k, v, g, beta, state


def close(a: Any, b: Any) -> None:
    np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("hv", [2, 4])
@pytest.mark.parametrize("t", [1, 5, 64, 65, 130, 200])
def test_chunk_matches_step_and_old_chunk(t: int, hv: int) -> None:
    q, k, v, g, beta, state = inputs(t, hv, seed=1000 * hv + t)
    s_new, s_step, s_old = state.copy(), state.copy(), state.copy()
    out = R.chunk(q, k, v, g, beta, s_new)
    ref = R.step(q, k, v, g, beta, s_step)
    old = old_gdn_chunk(q, k, v, g, beta, s_old)
    assert out.shape == (t, hv, DV)
    assert out.dtype == np.float32 and s_new.dtype == np.float32
    close(out, ref)
    close(s_new, s_step)
    close(out, old)
    close(s_new, s_old)


def test_chunk_continues_across_calls() -> None:
    """A prefill split into calls at odd lengths equals one call (chunked prefill)."""
    q, k, v, g, beta, state = inputs(200, 4, seed=7)
    whole, parts = state.copy(), state.copy()
    out = R.chunk(q, k, v, g, beta, whole)
    pieces = [
        R.chunk(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], parts)
        for a, b in [(0, 37), (37, 101), (101, 200)]
    ]
    close(np.concatenate(pieces), out)
    close(parts, whole)


def test_state_updated_in_place_through_a_view() -> None:
    hv = 4
    q, k, v, g, beta, state = inputs(130, hv, seed=3)
    rng = np.random.default_rng(4)
    pool = rng.standard_normal((3, hv, DK, DV)).astype(np.float32)
    pool[1] = state
    before = pool.copy()
    out = R.chunk(q, k, v, g, beta, pool[1])
    ref_state = state.copy()
    ref = R.step(q, k, v, g, beta, ref_state)
    close(out, ref)
    close(pool[1], ref_state)
    np.testing.assert_array_equal(pool[0], before[0])
    np.testing.assert_array_equal(pool[2], before[2])


def test_empty_call_leaves_state() -> None:
    q, k, v, g, beta, state = inputs(0, 2, seed=5)
    kept = state.copy()
    out = R.chunk(q, k, v, g, beta, state)
    assert out.shape == (0, 2, DV)
    np.testing.assert_array_equal(state, kept)
