"""The linear family's ``matmul`` on a GPU: our kernel (``kernels/matmul.cu``) against numpy's
product in float64, on the shapes and views GLM5Next's steps give it and on awkward ones
(rows, columns and depths off every tile edge, transposed operands, a broadcast batch, an
empty depth), within the family's ``nvrtc`` tolerance (a fraction of Σ_k |a_k| |b_k|); the
policy's choice eager (cuBLAS, the reference) and inside a capture (ours); and a captured
product replayed on new inputs. The launcher's shapes, strides and errors, which it works
out before any launch: tests/runtime/test_matmul_launch.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_runtime.ops.linear.reference import TOLERANCE

from .conftest import requires_gpu

pytestmark = requires_gpu

#: (a's shape, b's shape, a transposed in memory, b transposed in memory)
CASES = [
    ((1, 1), (1, 1), False, False),
    ((1, 17), (17, 65), False, False),
    ((3, 16, 31), (3, 31, 64), False, True),
    ((5, 17, 16), (16, 63), True, False),  # a 2-D b broadcast over a's batch
    ((1, 100, 33), (7, 33, 129), False, True),  # a batch of one broadcast over b's
    ((64, 8, 256), (64, 256, 512), True, False),  # GLM5Next's absorbed queries: [h, n, d]
    ((64, 8, 512), (64, 512, 256), True, True),  # its value expansion: value_upᵀ
    ((8, 64, 512), (8, 512, 300), False, True),  # latent scores over a lane's 300 tokens
    ((8, 64, 300), (8, 300, 512), False, False),  # and their mix of latents
    ((4, 4, 4), (4, 4, 4096), True, False),  # a hyper-connection's mixing of 4 streams
    ((2, 3, 0), (2, 0, 5), False, False),  # an empty depth: zeros
    ((3, 2, 4, 16), (3, 2, 16, 33), False, True),  # two batch axes: lanes x key heads
    ((2, 5, 7, 16), (2, 1, 16, 9), False, False),  # the inner batch broadcast
    ((4, 1, 6, 8), (3, 8, 20), True, True),  # a 3-D b broadcast under a 4-D a
]


def _operand(shape: tuple[int, ...], transposed: bool, rng: np.random.Generator) -> Any:
    """A device array of ``shape`` whose last two axes are stored swapped when
    ``transposed`` (a strided view, as ``x.swapaxes(-1, -2)`` gives)."""
    import cupy as cp

    host = rng.standard_normal(shape).astype(np.float32)
    if not transposed:
        return cp.asarray(host)
    return cp.ascontiguousarray(cp.asarray(host).swapaxes(-1, -2)).swapaxes(-1, -2)


def _check(got: Any, a: Any, b: Any) -> None:
    import cupy as cp

    a64, b64 = (cp.asnumpy(x).astype(np.float64) for x in (a, b))
    want = np.matmul(a64, b64)
    bound = TOLERANCE["nvrtc"] * np.matmul(np.abs(a64), np.abs(b64)) + 1e-30
    got = cp.asnumpy(got)
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.all(np.abs(got - want) <= bound), float(np.abs(got - want).max())


@pytest.mark.parametrize(("a_shape", "b_shape", "a_t", "b_t"), CASES)
def test_ours_matches_numpy(a_shape: tuple, b_shape: tuple, a_t: bool, b_t: bool) -> None:
    from ninfer_runtime.ops.linear import nvrtc

    rng = np.random.default_rng(sum(a_shape) + 7 * sum(b_shape))
    a, b = _operand(a_shape, a_t, rng), _operand(b_shape, b_t, rng)
    _check(nvrtc.matmul(a, b), a, b)


def test_captured_products_are_ours_and_replay_on_new_inputs() -> None:
    """Eager, ``ops.linear.matmul`` resolves to the reference (cuBLAS); inside a capture to
    ours (loaded before the capture, as a captured step's ``load_capture_only`` does), which
    the graph then replays on whatever its inputs hold."""
    import cupy as cp

    from ninfer_runtime.backends.cuda.compile import CAPTURE_ONLY, load_capture_only
    from ninfer_runtime.ops import registry
    from ninfer_runtime.ops.linear import matmul, nvrtc, reference

    assert registry.resolve("linear", "matmul", device="cuda", capturing=False) is reference.matmul
    assert registry.resolve("linear", "matmul", device="cuda", capturing=True) is nvrtc.matmul
    rng = np.random.default_rng(5)
    a = cp.asarray(rng.standard_normal((8, 64, 512)).astype(np.float32))
    b = cp.asarray(rng.standard_normal((8, 300, 512)).astype(np.float32))
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    assert "matmul" in CAPTURE_ONLY
    with stream:
        matmul(a, b.swapaxes(1, 2))  # eager: cuBLAS
        load_capture_only()
        stream.synchronize()
        with cp.cuda.using_allocator(pool.malloc):
            stream.begin_capture()
            out = matmul(a, b.swapaxes(1, 2))
            graph = stream.end_capture()
        for seed in (1, 2):
            fresh = np.random.default_rng(seed)
            a.set(fresh.standard_normal(a.shape).astype(np.float32), stream=stream)
            b.set(fresh.standard_normal(b.shape).astype(np.float32), stream=stream)
            graph.launch(stream)
            stream.synchronize()
            _check(out, a, b.swapaxes(1, 2))
