"""Kept device arrays (``backends/cuda/constants.py``): made once eagerly, never kept from a
stream capture (their contents would only exist when the graph replays)."""

from __future__ import annotations

import numpy as np

from ninfer_runtime.backends.cuda.constants import device_constant

from .conftest import requires_gpu

pytestmark = requires_gpu


def test_an_eager_constant_is_made_once() -> None:
    import cupy as cp

    made = []

    def build() -> object:
        made.append(1)
        return cp.arange(3, 9, dtype=cp.int32)

    first = device_constant(("test eager", 3, 9), build)
    again = device_constant(("test eager", 3, 9), build)
    assert again is first and len(made) == 1
    np.testing.assert_array_equal(cp.asnumpy(first), np.arange(3, 9))
    other = device_constant(("test eager", 3, 10), lambda: cp.arange(3, 10, dtype=cp.int32))
    assert other is not first and other.size == 7


def test_a_constant_first_made_in_a_capture_is_not_kept() -> None:
    import cupy as cp

    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    key = ("test capture", 0, 5)
    with stream, cp.cuda.using_allocator(pool.malloc):  # as graphs.GraphStep captures
        stream.begin_capture()
        inside = device_constant(key, lambda: cp.arange(5, dtype=cp.int32))
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(inside), np.arange(5))
    eager = device_constant(key, lambda: cp.arange(5, dtype=cp.int32))
    assert eager is not inside
    assert device_constant(key, lambda: cp.zeros(5, dtype=cp.int32)) is eager
