"""The launcher of our ``matmul`` kernel (``backends/cuda/matmul.py``) on the CPU: its launch
arguments, read as ``kernels/matmul.cu`` reads them (element strides of each operand's outer
and inner batch axes, rows and columns; grid z over outer x inner, from ``batch0``), address
numpy's ``matmul`` of the same views: transposed operands, broadcast batches (a missing axis,
an axis of one), two batch axes, several launches along z. CuPy is stood in for by numpy
and the kernel by a reader of its arguments; the kernel's own arithmetic is
tests/gpu/test_matmul.py's."""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.backends.cuda import matmul as launcher


def _element(x: np.ndarray, offset: int) -> float:
    """The element ``offset`` elements past x's first one, in x's own memory."""
    base = x
    while base.base is not None:
        base = base.base
    start = (x.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // x.itemsize
    return float(base.reshape(-1)[start + offset])


def kernel(grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]) -> None:
    """The kernel's reading of its arguments: C's rows and columns of the launch's grid."""
    a, b, c, m, n, k, a_o, a_i, a_r, a_c, b_o, b_i, b_r, b_c, inner, batch0 = args
    assert block == (launcher.THREADS,)
    flat = c.reshape(-1, int(m), int(n))
    for z in range(grid[2]):
        outer, within = divmod(int(batch0) + z, int(inner))
        for row in range(int(m)):
            for col in range(int(n)):
                flat[int(batch0) + z, row, col] = sum(
                    _element(a, outer * a_o + within * a_i + row * a_r + j * a_c)
                    * _element(b, outer * b_o + within * b_i + j * b_r + col * b_c)
                    for j in range(int(k))
                )


@pytest.fixture
def on_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """``cupy`` as numpy for the launcher, and the kernel as ``kernel``; grid z at most 3."""
    monkeypatch.setitem(
        sys.modules, "cupy", types.SimpleNamespace(float32=np.float32, empty=np.empty)
    )
    monkeypatch.setattr(launcher, "function", lambda family, name: kernel)
    monkeypatch.setattr(launcher, "GRID_Z", 3)


def _operand(shape: tuple[int, ...], transposed: bool, rng: np.random.Generator) -> np.ndarray:
    host = rng.standard_normal(shape).astype(np.float32)
    return np.ascontiguousarray(host.swapaxes(-1, -2)).swapaxes(-1, -2) if transposed else host


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "a_t", "b_t"),
    [
        ((3, 4), (4, 2), False, False),
        ((5, 3, 4), (4, 6), True, False),  # a 2-D b under a batch of 5 (two launches along z)
        ((1, 3, 4), (2, 4, 5), False, True),  # a batch of one broadcast
        ((3, 2, 4, 5), (3, 2, 5, 3), False, True),  # two batch axes
        ((2, 5, 3, 4), (2, 1, 4, 2), False, False),  # the inner one broadcast
        ((4, 1, 3, 2), (3, 2, 5), True, True),  # a 3-D b under a 4-D a
        ((2, 3, 0), (2, 0, 5), False, False),  # an empty depth: zeros, no launch
    ],
)
def test_the_launch_addresses_numpys_product(
    on_numpy: None, a_shape: tuple, b_shape: tuple, a_t: bool, b_t: bool
) -> None:
    rng = np.random.default_rng(sum(a_shape) + sum(b_shape))
    a, b = _operand(a_shape, a_t, rng), _operand(b_shape, b_t, rng)
    got = launcher.matmul(a, b)
    assert got.shape == np.matmul(a, b).shape
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_shapes_it_cannot_take_are_one_line_errors(on_numpy: None) -> None:
    with pytest.raises(ValueError, match=r"matmul: a \(2, 3\) and b \(4, 5\)"):
        launcher.matmul(np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match=r"batches \(2,\) and \(3,\) do not broadcast"):
        launcher.matmul(np.zeros((2, 1, 3), np.float32), np.zeros((3, 3, 5), np.float32))
    with pytest.raises(ValueError, match="at most two batch axes"):
        launcher.matmul(np.zeros((1, 1, 1, 2, 3), np.float32), np.zeros((3, 5), np.float32))
