"""Expert offload on the other MoE architectures, on the CPU backend: tiny Qwen4Exp (Qwen3.5's
softmax router) and tiny GLM5Next (grouped sigmoid routing with ``routed_scaling_factor`` and
shared experts) under budgets that keep none, half or all of their routed experts resident
give the all-resident logits (within float32 rounding: the host's partial sums are added
apart) and the same greedy tokens, with the host experts computed from their stored blocks or
from decoded copies. The split routes with each block's own ``route``: were it
to use a softmax top-k on GLM5Next, the host pairs would get other experts and weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ninfer_runtime.engine import Engine
from ninfer_runtime.runner import ModelRunner
from tests.runtime.offload_runs import CONTEXT, budget_shares, engine
from tests.runtime.offload_runs import greedy as greedy_run

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPT = np.array([7, 300, 12, 45, 9, 101, 77, 3, 250, 18, 64, 5], dtype=np.int64)
STEPS = 4


def greedy(runner: ModelRunner) -> tuple[list[int], np.ndarray]:
    """The prompt in two chunks, then ``STEPS`` greedy steps."""
    return greedy_run(runner, PROMPT, STEPS)


def _qwen4_exp(root: Path) -> Path:
    from ninfer_convert.pipeline import convert
    from tests import tiny_qwen4_exp as tiny

    checkpoint = tiny.build(root / "qwen4_exp", ple_layer_ids=[], mtp=False)
    convert("qwen4_exp_bf16", {"base": str(checkpoint)}, root / "qwen4_exp.ninfer")
    return root / "qwen4_exp.ninfer"


def _glm5_next(root: Path) -> Path:
    from tests import tiny_glm5_next as tiny

    checkpoint = tiny.build_tiny_glm5_next(root / "glm5_next")
    tiny.convert("glm5_next_bf16", checkpoint, root / "glm5_next.ninfer")
    return root / "glm5_next.ninfer"


@pytest.fixture(scope="module", params=["qwen4_exp", "glm5_next"])
def case(request, tmp_path_factory):
    """An artifact, its all-resident greedy run, and its budget's floor and expert bytes."""
    root = tmp_path_factory.mktemp(request.param)
    path = {"qwen4_exp": _qwen4_exp, "glm5_next": _glm5_next}[request.param](root)
    reference = greedy(Engine(path, max_context=CONTEXT, max_lanes=1).runner)
    return path, reference, *budget_shares(path)


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_residency_leaves_logits_and_greedy_tokens(case, fraction):
    path, (tokens, logits), floor, experts = case
    # none resident: no decoded copies either, every host expert from its stored blocks
    e = engine(path, floor + int(fraction * experts), host_cache=0 if fraction == 0 else None)
    offload = e.expert_offload
    held = [x.held is not None for b in offload.blocks for x in b.host_experts.values()]
    assert held == [fraction != 0] * len(held) and (len(held) > 0) == (fraction < 1)
    assert offload.plan.resident_fraction == fraction
    assert len(offload.blocks) == len(offload.plan.experts) >= 2
    offload.counters.reset()
    got_tokens, got = greedy(e.runner)
    assert got_tokens == tokens
    np.testing.assert_allclose(got, logits, rtol=0, atol=1e-4)
    if fraction == 1.0:  # no host pair: the block's own call alone, the same numbers
        np.testing.assert_array_equal(got, logits)
    counters = offload.counters
    assert (counters.device_total > 0) == (fraction > 0)
    assert (counters.host_total > 0) == (fraction < 1)
    top_k = 2  # both tiny configs route each token to two experts
    pairs = (len(PROMPT) + STEPS) * top_k * len(offload.blocks)
    assert counters.device_total + counters.host_total == pairs
