"""The attention family's ``segment`` op (a vision tower's attention within each frame): its
policy rows, the reference against the function it replaced (bit for bit) and against float64
attention with a mask per segment, and the ``sdpa`` provider's torch half on the CPU (the
CUDA run is tests/gpu/test_images_cuda.py)."""

from __future__ import annotations

import importlib
import itertools

import numpy as np
import pytest

from ninfer_runtime.ops import registry
from ninfer_runtime.ops.attention import policy, segment_reference
from ninfer_runtime.ops.attention.reference import TOLERANCE
from ninfer_runtime.ops.attention.segment_reference import segment

#: P rows in three segments (frames), 3 heads of 8
BOUNDS, HEADS, D = (0, 7, 30, 50), 3, 8


def inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((BOUNDS[-1], HEADS, D)).astype(np.float32) for _ in range(3))


def segment_attention_before_the_move(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, bounds: tuple[int, ...], scale: float, block: int
) -> np.ndarray:
    """``vision_ops.segment_attention`` as it stood before it became the family's reference
    (its statements unchanged), kept here as the bit-for-bit pin."""
    out = np.empty_like(q)
    heads = q.shape[1]
    for start, stop in itertools.pairwise(bounds):
        keys = k[start:stop].transpose(1, 2, 0)
        values = v[start:stop].transpose(1, 0, 2)
        step = max(1, block // (heads * (stop - start)))
        for first in range(start, stop, step):
            last = min(first + step, stop)
            queries = q[first:last].transpose(1, 0, 2)
            x = (queries @ keys) * np.float32(scale)
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            probs = e / e.sum(axis=-1, keepdims=True)
            out[first:last] = (probs @ values).transpose(1, 0, 2)
    return out


def masked_float64(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Attention over all rows in float64, each row masked to its own segment."""
    frame = np.searchsorted(BOUNDS, np.arange(BOUNDS[-1]), side="right")
    q, k, v = (a.astype(np.float64).transpose(1, 0, 2) for a in (q, k, v))
    scores = np.where(frame[:, None] == frame[None, :], q @ k.transpose(0, 2, 1) * scale, -np.inf)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return ((e / e.sum(axis=-1, keepdims=True)) @ v).transpose(1, 0, 2)


def test_policy_rows_and_providers() -> None:
    assert policy.TABLE[("segment", "cpu")] == ("reference",)
    assert policy.TABLE[("segment", "cuda")] == ("sdpa", "reference")
    table = registry.providers("attention")["segment"]
    assert set(table) == {"reference", "sdpa"}
    assert table["sdpa"].requires == ("cupy", "torch")
    sdpa = importlib.import_module(table["sdpa"].module)
    assert sdpa.accepts(device="cuda", precision="bf16", head_dim=72)
    assert not sdpa.accepts(device="cpu", precision="bf16", head_dim=72)
    assert not sdpa.accepts(device="cuda", precision="float32", head_dim=72)
    key = {"device": "cpu", "precision": "float32", "head_dim": D}
    assert registry.resolve("attention", "segment", **key) is segment


@pytest.mark.parametrize("block", [1 << 24, 40], ids=["whole", "query-blocks"])
def test_reference_is_the_function_it_replaced(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v = inputs()
    monkeypatch.setattr(segment_reference, "SCORE_BLOCK_ELEMENTS", block)
    got = segment(q, k, v, BOUNDS, D**-0.5)
    want = segment_attention_before_the_move(q, k, v, BOUNDS, D**-0.5, block)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_reference_attends_within_each_segment_only() -> None:
    q, k, v = inputs(1)
    want = masked_float64(q, k, v, D**-0.5)
    rtol, atol = TOLERANCE["reference"]
    got = segment(q, k, v, BOUNDS, D**-0.5)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * np.abs(want).max())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sdpa_torch_half_on_the_cpu(dtype: str) -> None:
    """The provider's per-segment torch calls (the part that does not need CuPy) on CPU
    tensors: float32 to float32 rounding, bf16 inputs within the provider's tolerance."""
    torch = pytest.importorskip("torch")
    from ninfer_runtime.ops.attention.segment_sdpa import attend_segments

    q, k, v = inputs(2)
    want = masked_float64(q, k, v, D**-0.5)
    tensors = (torch.from_numpy(a).to(getattr(torch, dtype)) for a in (q, k, v))
    got = attend_segments(*tensors, BOUNDS, D**-0.5)
    assert got.dtype == torch.float32
    rtol, atol = TOLERANCE["reference" if dtype == "float32" else "sdpa"]
    np.testing.assert_allclose(got.numpy(), want, rtol=rtol, atol=atol * np.abs(want).max())
