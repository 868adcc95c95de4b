"""The residual add fused into RMSNorm (``add_rms_norm``): the reference op, and the model's
layer stack built on it against the add-then-norm stack it replaced, bit for bit on the CPU."""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.models import load_model
from ninfer_runtime.ops import registry
from ninfer_runtime.ops.norm.reference import add_rms_norm, rms_norm
from ninfer_runtime.runner import ModelRunner

EPS = 1e-6


def oracle(h: np.ndarray, delta: np.ndarray, w: np.ndarray, offset: float) -> np.ndarray:
    s = h.astype(np.float64) + delta
    return s / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + EPS) * (w + offset)


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 257), (2, 3, 1000)])
def test_reference_is_the_add_then_the_norm(shape: tuple[int, ...], offset: float) -> None:
    rng = np.random.default_rng(shape[-1])
    h = (rng.standard_normal(shape) * 3).astype(np.float32)
    delta = rng.standard_normal(shape).astype(np.float32)
    w = (rng.standard_normal(shape[-1]) * 0.1).astype(np.float32)
    s, y = registry.resolve("norm", "add_rms_norm", device="cpu")(h, delta, w, EPS, offset)
    assert s.dtype == y.dtype == np.float32 and s.shape == y.shape == shape
    np.testing.assert_array_equal(s, h + delta)
    np.testing.assert_array_equal(y, rms_norm(h + delta, w, EPS, offset))
    np.testing.assert_allclose(y, oracle(h, delta, w, offset), rtol=1e-5, atol=1e-6)
    assert add_rms_norm(h, delta, w, EPS, offset)[1].tobytes() == y.tobytes()


def unfused_hidden(self: Any, ids: Any, batch: Any, pool: Any, embeddings: Any = None) -> Any:
    """The layer stack as it was: each residual add on its own, then the next norm."""
    be, eps = self.backend, self.config.eps
    h = be.embedding(ids, self.token_embedding) if embeddings is None else embeddings
    for layer, memory in zip(self.layers, pool.layers, strict=True):
        h = h + layer.mixer(rms_norm(h, layer.input_norm, eps, offset=1.0), batch, memory)
        h = h + layer.ffn(rms_norm(h, layer.post_attention_norm, eps, offset=1.0))
    return rms_norm(h, self.final_norm, eps, offset=1.0)


def unfused_mtp(runner: ModelRunner, hidden: Any, ids: np.ndarray, state: Any) -> Any:
    """``mtp_logits`` with the MTP block's residual adds unfused."""
    model = runner.model
    be, mtp, eps = model.backend, model.mtp, model.config.eps
    start = state.mtp_length
    batch = runner.batch(
        [_lane(len(ids), start, state)], np.arange(start + 1, start + 1 + len(ids))
    )
    e = rms_norm(be.embedding(ids, mtp.token_embedding), mtp.embedding_norm, eps, offset=1.0)
    hh = rms_norm(hidden, mtp.hidden_norm, eps, offset=1.0)
    x = be.linear(np.concatenate([e, hh], axis=-1), mtp.input_projection)
    block = mtp.block
    x = x + block.mixer(rms_norm(x, block.input_norm, eps, offset=1.0), batch, state.pool.mtp)
    x = x + block.ffn(rms_norm(x, block.post_attention_norm, eps, offset=1.0))
    state.mtp_length = start + len(ids)
    return mtp.logits(rms_norm(x, mtp.final_norm, eps, offset=1.0))


def _lane(tokens: int, start: int, state: Any) -> Any:
    from ninfer_runtime.models.batch import Lane

    return Lane(slice(0, tokens), start, state)


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_fused_stack_equals_the_unfused_one_bit_for_bit(
    kind: str, artifact_path: Callable[[str, str], Path]
) -> None:
    recipe = {"dense": "qwen3_5_bf16", "moe": "qwen3_5_moe_bf16"}[kind]
    model = load_model(artifact_path(recipe, kind))
    runner = ModelRunner(model)
    assert model.mtp is not None
    prompt = np.random.default_rng(1).integers(0, model.config.vocab, 21)

    def run(unfused: bool) -> list[np.ndarray]:
        state = runner.new_state(64)
        out = runner.forward([prompt], [state])  # prefill
        got = [out.logits[0], out.hidden[0]]
        for _ in range(3):  # decode steps (one token, device-indexed batch)
            token = int(np.argmax(out.logits[0][-1]))
            out = runner.forward([np.array([token])], [state])
            got += [out.logits[0], out.hidden[0]]
        mtp = unfused_mtp(runner, got[1][:-1], prompt[1:], state) if unfused else None
        return [*got, runner.mtp_logits(got[1][:-1], prompt[1:], state) if mtp is None else mtp]

    fused = run(unfused=False)
    model.hidden_states = types.MethodType(unfused_hidden, model)  # type: ignore[method-assign]
    unfused = run(unfused=True)
    for a, b in zip(fused, unfused, strict=True):
        np.testing.assert_array_equal(a, b)
