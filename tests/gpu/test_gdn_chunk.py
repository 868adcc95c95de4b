"""The chunked Gated DeltaNet prefill kernels (``cuda/gdn_chunk.py``) against the reference
(``array_ops.gdn_chunk`` in float64 on the same float32 inputs).

Awkward sizes on purpose: token counts around the 64-token chunk, a value head size that
does not fill the 32/64-column tiles, value heads sharing key heads 1, 2 or 3 ways, every
compiled key head size, and a state carried in from before (as a prefill chunk after the
first has)."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.backends import array_ops as A
from ninfer_runtime.backends.cuda import gdn_chunk
from ninfer_runtime.models.functional import l2_normalize

from .conftest import requires_gpu

pytestmark = requires_gpu


def _inputs(rng: np.random.Generator, t: int, hk: int, hv: int, dk: int, dv: int) -> tuple:
    q = l2_normalize(rng.standard_normal((t, hk, dk))) * dk**-0.5
    k = l2_normalize(rng.standard_normal((t, hk, dk)))
    v = rng.standard_normal((t, hv, dv))
    g = -np.log1p(np.exp(rng.standard_normal((t, hv)))) * 0.3  # log-decay <= 0
    beta = 1 / (1 + np.exp(-rng.standard_normal((t, hv))))
    state = rng.standard_normal((hv, dk, dv)) * 0.5
    return tuple(a.astype(np.float32) for a in (q, k, v, g, beta, state))


CASES = [  # (tokens, key heads, value heads, dk, dv)
    (1, 1, 1, 16, 16),
    (63, 2, 4, 16, 36),
    (64, 1, 3, 32, 64),
    (65, 2, 2, 64, 20),
    (200, 2, 6, 128, 128),
    (333, 16, 48, 128, 128),  # the 27B layer's heads
]


@pytest.mark.parametrize(("t", "hk", "hv", "dk", "dv"), CASES)
def test_gdn_chunk_matches_the_reference(t: int, hk: int, hv: int, dk: int, dv: int) -> None:
    import cupy as cp

    rng = np.random.default_rng(t * 7 + dk)
    q, k, v, g, beta, state = _inputs(rng, t, hk, hv, dk, dv)
    want_state = state.astype(np.float64)
    want = A.gdn_chunk(*(a.astype(np.float64) for a in (q, k, v, g, beta)), want_state)

    got_state = cp.asarray(state)
    got = gdn_chunk.gdn_chunk(*(cp.asarray(a) for a in (q, k, v, g, beta)), got_state)
    for name, x, ref in (("out", got, want), ("state", got_state, want_state)):
        x = cp.asnumpy(x).astype(np.float64)
        assert np.all(np.isfinite(x)), name
        scale = float(np.abs(ref).max())
        np.testing.assert_allclose(x, ref, rtol=1e-4, atol=2e-5 * scale, err_msg=name)


def test_gdn_chunk_continues_where_an_earlier_chunk_left_off() -> None:
    """Two calls over halves equal one call over the whole (the state carries everything)."""
    import cupy as cp

    rng = np.random.default_rng(5)
    q, k, v, g, beta, state = (cp.asarray(a) for a in _inputs(rng, 150, 2, 4, 64, 64))
    whole_state = state.copy()
    whole = gdn_chunk.gdn_chunk(q, k, v, g, beta, whole_state)
    halves = [
        gdn_chunk.gdn_chunk(q[s], k[s], v[s], g[s], beta[s], state)
        for s in (slice(0, 77), slice(77, 150))
    ]
    np.testing.assert_allclose(
        cp.asnumpy(cp.concatenate(halves)), cp.asnumpy(whole), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(cp.asnumpy(state), cp.asnumpy(whole_state), rtol=1e-4, atol=1e-5)


def test_the_backend_runs_the_kernels_for_supported_shapes(cuda_backend) -> None:
    import cupy as cp

    rng = np.random.default_rng(1)
    q, k, v, g, beta, state = (cp.asarray(a) for a in _inputs(rng, 70, 1, 2, 32, 32))
    assert gdn_chunk.supported(q, k, v, state)
    ref_state = state.copy()
    got = cuda_backend.gdn_chunk(q, k, v, g, beta, state)
    want = A.gdn_chunk(q, k, v, g, beta, ref_state)  # the reference on CuPy
    np.testing.assert_allclose(cp.asnumpy(got), cp.asnumpy(want), rtol=1e-4, atol=1e-5)
    # an odd value head size is the reference's
    q, k, v, g, beta, state = (cp.asarray(a) for a in _inputs(rng, 5, 1, 2, 32, 18))
    assert not gdn_chunk.supported(q, k, v, state)
    assert cuda_backend.gdn_chunk(q, k, v, g, beta, state).shape == (5, 2, 18)
