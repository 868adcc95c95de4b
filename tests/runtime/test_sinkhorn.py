"""The norm family's ``sinkhorn`` (GLM5Next's hyper-connection mixing): the reference against
the definition written out a matrix and an entry at a time in float64, and what GLM5Next's
connections resolve on the CPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ninfer_runtime.ops import registry
from ninfer_runtime.ops.norm import reference


def oracle(logits: np.ndarray, iterations: int, eps: float) -> np.ndarray:
    """Softmax of each row plus eps; columns, then rows and columns in turn, each sum + eps."""
    out = np.empty(logits.shape, dtype=np.float64)
    n = logits.shape[-1]
    for index in np.ndindex(*logits.shape[:-2]):
        c = [[0.0] * n for _ in range(n)]
        for i in range(n):
            row = [float(v) for v in logits[index][i]]
            e = [math.exp(v - max(row)) for v in row]
            c[i] = [v / sum(e) + eps for v in e]
        for r in range(iterations):
            if r:
                for i in range(n):
                    total = sum(c[i]) + eps
                    c[i] = [v / total for v in c[i]]
            for j in range(n):
                total = sum(c[i][j] for i in range(n)) + eps
                for i in range(n):
                    c[i][j] /= total
        out[index] = c
    return out


def random_logits(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 3).astype(np.float32)


@pytest.mark.parametrize(
    ("shape", "iterations"), [((1, 4, 4), 20), ((5, 4, 4), 1), ((2, 3, 8, 8), 7)]
)
def test_reference_is_the_definition(shape: tuple[int, ...], iterations: int) -> None:
    logits = random_logits(shape, shape[-1] + iterations)
    got = reference.sinkhorn(logits, iterations=iterations, eps=1e-6)
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_allclose(got, oracle(logits, iterations, 1e-6), rtol=2e-6, atol=1e-7)
    # the last pass normalised the columns: each sums to s / (s + eps) of its sum s before
    np.testing.assert_allclose(got.sum(axis=-2), 1.0, rtol=1e-4)


def test_the_cpu_resolves_the_reference() -> None:
    assert registry.resolve("norm", "sinkhorn", device="cpu") is reference.sinkhorn
