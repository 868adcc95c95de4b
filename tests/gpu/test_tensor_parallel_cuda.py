"""Tensor parallelism on two GPUs: rank r on GPU r, NCCL between them (``parallel.nccl``),
each rank reading its rows of the packed weights in place (``weight_plans.rank_share``). The two
ranks give one GPU's greedy tokens on the tiny dense and MoE models, CUDA graphs (with the
collectives inside) included."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.parallel.nccl import unavailable_reason

from .conftest import REASON as NO_GPU

REASON = NO_GPU or unavailable_reason(2)  # a GPU, then two of them and NCCL
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]
PROMPT = np.array([7, 300, 12, 45, 9, 101, 77, 3, 250, 18, 64, 5], dtype=np.int64)


def greedy(runner, tokens: int) -> tuple[list[int], list[np.ndarray]]:
    """The prompt prefilled in two chunks, then ``tokens`` greedy decode steps."""
    import cupy as cp

    state = runner.new_state(64)
    logits = cp.asnumpy(runner.prefill(PROMPT, state, chunk=8, last_only=True).logits[0][-1])
    out, seen = [], [logits]
    for _ in range(tokens):
        out.append(int(np.argmax(logits)))
        logits = cp.asnumpy(runner.forward([np.array([out[-1]])], [state]).logits[0][-1])
        seen.append(logits)
    return out, seen


@pytest.mark.parametrize(
    ("recipe", "kind", "expert_parallel"),
    [
        ("tiny_mixed", "dense", False),
        ("tiny_mixed", "moe", False),
        ("tiny_mixed", "moe", True),
        ("tiny_q4", "moe", True),
    ],
    ids=["dense", "moe-split-experts", "moe-whole-experts", "moe-whole-experts-q4"],
)
def test_two_gpus_give_one_gpus_greedy_tokens(gpu_artifact, recipe, kind, expert_parallel) -> None:
    from ninfer_format import Artifact
    from ninfer_runtime.models import load_model
    from ninfer_runtime.runner import ModelRunner
    from ninfer_runtime.tensor_parallel import parallel_runner

    path = gpu_artifact(recipe, kind)
    want, want_logits = greedy(ModelRunner(load_model(path, "cuda")), tokens=12)
    model, runner, stop = parallel_runner(Artifact.open(path), "cuda", 2, expert_parallel)
    try:
        assert model.collective.world == 2
        got, got_logits = greedy(runner, tokens=12)
    finally:
        stop()
    assert got == want
    for a, b in zip(got_logits, want_logits, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3 * np.abs(b).max())
