"""The moe and norm op families on the CPU: the MoE block's reference against the block's
math written out in float64, an expert left out (None) drops exactly its own pairs, and the
model's MoE layer and the models' norms are served by the families (a patched op is what
runs)."""

from __future__ import annotations

import dataclasses

import numpy as np

from ninfer_runtime.backends.base import ExpertWeights, MoeWeights
from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.ops import registry
from ninfer_runtime.ops.moe.reference import TOLERANCE

E, K, H, INTER = 6, 2, 16, 12


def random_block(seed: int = 0) -> MoeWeights:
    rng = np.random.default_rng(seed)

    def w(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def mlp() -> ExpertWeights:
        return ExpertWeights(w(INTER, H), w(INTER, H), w(H, INTER))

    return MoeWeights(w(E, H), [mlp() for _ in range(E)], mlp(), w(1, H), K)


def written_out(x: np.ndarray, m: MoeWeights) -> np.ndarray:
    """softmax router, renormalised top-k, SiLU-gated experts, sigmoid-scaled shared expert,
    one row at a time in float64."""
    x = x.astype(np.float64)

    def mlp(ex: ExpertWeights, row: np.ndarray) -> np.ndarray:
        g, u = ex.gate @ row, ex.up @ row
        return ex.down @ (g / (1 + np.exp(-g)) * u)

    out = np.empty_like(x)
    for i, row in enumerate(x):
        logits = m.router @ row
        p = np.exp(logits - logits.max())
        p /= p.sum()
        top = np.argsort(-p, kind="stable")[:K]
        share = p[top] / p[top].sum()
        routed = sum(s * mlp(m.experts[e], row) for e, s in zip(top, share, strict=True))
        score = 1 / (1 + np.exp(-(m.shared_score @ row)[0]))
        out[i] = routed + score * mlp(m.shared, row)
    return out


def test_the_block_reference_is_the_written_out_math() -> None:
    weights = random_block()
    x = np.random.default_rng(1).standard_normal((9, H)).astype(np.float32)
    block = registry.resolve("moe", "block", device="cpu")
    got, want = block(CpuBackend(), x, weights), written_out(x, weights)
    rtol, atol = TOLERANCE["reference"]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * np.abs(want).max())


def test_an_expert_left_out_drops_exactly_its_pairs() -> None:
    weights = random_block(2)
    x = np.random.default_rng(3).standard_normal((12, H)).astype(np.float32)
    be, block = CpuBackend(), registry.resolve("moe", "block", device="cpu")
    route = registry.resolve("moe", "route", device="cpu")
    logits = be.linear(x, weights.router)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    top, share = route(probs / probs.sum(-1, keepdims=True), K)
    dropped = int(np.bincount(top.ravel(), minlength=E).argmax())  # the most chosen expert
    held = dataclasses.replace(
        weights, experts=[None if e == dropped else ex for e, ex in enumerate(weights.experts)]
    )
    ex = weights.experts[dropped]
    rows, slot = np.nonzero(top == dropped)
    own = np.zeros_like(x)
    gate, up = x[rows] @ ex.gate.T, x[rows] @ ex.up.T
    own[rows] = share[rows, slot, None] * ((gate / (1 + np.exp(-gate)) * up) @ ex.down.T)
    assert len(rows) > 0
    np.testing.assert_allclose(block(be, x, weights) - block(be, x, held), own, atol=1e-5)


def test_the_models_moe_layer_is_served_by_the_family() -> None:
    from ninfer_runtime.models.qwen3_5.config import MoeConfig
    from ninfer_runtime.models.qwen3_5.mlp import SparseMoe

    weights = random_block()
    names = {"l/moe/router": weights.router, "l/moe/shared_score": weights.shared_score}
    for q, ex in [*((f"experts/{e}/", ex) for e, ex in enumerate(weights.experts)),
                  ("shared/", weights.shared)]:  # fmt: skip
        names |= {f"l/moe/{q}gate": ex.gate, f"l/moe/{q}up": ex.up, f"l/moe/{q}down": ex.down}
    be = CpuBackend()
    config = MoeConfig(experts=E, top_k=K, expert_width=INTER, shared_width=INTER)
    layer = SparseMoe("l/", config, be, names)
    x = np.ones((2, H), np.float32)
    with registry.patched("moe", "block", lambda backend, x, weights: "the family's block"):
        assert layer(x) == "the family's block"
    np.testing.assert_allclose(layer(x), written_out(x, weights), rtol=1e-5, atol=1e-6)


def test_the_models_norms_are_served_by_the_norm_family() -> None:
    from ninfer_runtime.models.qwen3_5.layer import add_norm
    from ninfer_runtime.models.qwen4_exp.hyper_connections import GroupNorm

    be, x, w = CpuBackend(), np.ones((2, H), np.float32), np.zeros(H, np.float32)

    def sevens(x: np.ndarray, *_: object, **__: object) -> np.ndarray:
        return np.full(x.shape, 7.0, np.float32)

    with registry.patched("norm", "rms_norm", sevens):
        assert (add_norm(be, x, None, w, 1e-6)[1] == 7).all()
        assert (GroupNorm(be, w, 2, 1e-6)(x) == 7).all()
    with registry.patched("norm", "add_rms_norm", lambda h, *_, **__: (h, sevens(h))):
        assert (add_norm(be, x, x, w, 1e-6)[1] == 7).all()
    s, y = add_norm(be, x, x, w, 1e-6)  # the reference again once the patch ends
    np.testing.assert_array_equal(s, 2 * x)
    np.testing.assert_allclose(y, np.ones_like(x), rtol=1e-5)
