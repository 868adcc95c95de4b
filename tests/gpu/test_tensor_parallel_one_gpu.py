"""The ranks' math on the CUDA backend where one GPU is all there is: two ranks as threads
sharing it, each with its own backend (graphs off) and its share of the model (heads and
split experts, or with expert parallelism its experts whole: the stand-in entries and zeroed
shares of ``moe_experts.ExpertTable``), combined by ``ThreadGroup``'s collectives over device arrays
instead of NCCL. They give one rank's greedy tokens; the NCCL run over two GPUs is
``test_tensor_parallel_cuda.py``."""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtime.test_tensor_parallel import each_rank

from .conftest import REASON
from .test_tensor_parallel_cuda import greedy

#: a prompt past the rows the MoE decode path takes (64): prefilled whole, it runs the grouped
#: expert products (``moe.moe_prefill``)
LONG = np.random.default_rng(5).integers(3, 400, 150)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


CASES = pytest.mark.parametrize(
    ("recipe", "kind", "expert_parallel"),
    [
        ("tiny_mixed", "dense", False),
        ("tiny_mixed", "moe", False),
        ("tiny_mixed", "moe", True),  # NVFP4 / fp8 experts: banks uploaded whole
        ("tiny_q4", "moe", True),  # q4 experts: each rank uploads its experts' rows only
    ],
    ids=["dense", "moe-split-experts", "moe-whole-experts", "moe-whole-experts-q4"],
)


def long_prefill(runner) -> tuple[list[int], np.ndarray]:
    """``LONG`` prefilled in one chunk, then 4 greedy steps: the tokens, the prompt's logits."""
    import cupy as cp

    state = runner.new_state(256)
    logits = cp.asnumpy(runner.prefill(LONG, state, chunk=256).logits[0])
    out, last = [], logits[-1]
    for _ in range(4):
        out.append(int(np.argmax(last)))
        last = cp.asnumpy(runner.forward([np.array([out[-1]])], [state]).logits[0][-1])
    return out, logits


def two_ranks(path, expert_parallel: bool, work, prefill: str = "bf16") -> tuple:
    """``work(runner)`` on one rank, then on each of two ranks sharing the GPU as threads
    (``prefill``: the prefill products' precision)."""
    from ninfer_runtime.backends.cuda.backend import CudaBackend
    from ninfer_runtime.models import load_model
    from ninfer_runtime.parallel import ThreadGroup
    from ninfer_runtime.runner import ModelRunner

    def backend() -> CudaBackend:
        return CudaBackend(graphs=False, prefill_precision=prefill)

    want = work(ModelRunner(load_model(path, backend())))
    group = ThreadGroup(2, timeout=120)
    runners = [
        ModelRunner(load_model(path, backend(), group.rank(r), expert_parallel)) for r in range(2)
    ]
    if expert_parallel:
        experts = runners[0].model.config.moe.experts
        assert runners[1].model.config.moe.held == range(experts // 2, experts)
    return want, each_rank(group, lambda rank: work(runners[rank.rank]))


@CASES
def test_two_ranks_on_one_gpu_give_one_ranks_greedy_tokens(
    gpu_artifact, recipe, kind, expert_parallel
) -> None:
    path = gpu_artifact(recipe, kind)
    (want, want_logits), ranks = two_ranks(path, expert_parallel, lambda r: greedy(r, 12))
    for got, got_logits in ranks:
        assert got == want
        for a, b in zip(got_logits, want_logits, strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3 * np.abs(b).max())


@CASES
def test_two_ranks_on_one_gpu_prefill_a_long_prompt_as_one_rank(
    gpu_artifact, recipe, kind, expert_parallel
) -> None:
    """The same for a 150-token prompt in one chunk: on the MoE models the grouped expert
    products of a prefill pass (with whole experts, the other rank's pairs left out). The
    products in float32: with bf16 operands the ranks' partial sums round differently (run
    so once: the greedy tokens matched in every case, the prompt logits were up to 0.29
    apart with split experts and 0.016 dense; a near tie in a router's top-k can flip)."""
    path = gpu_artifact(recipe, kind)
    (want, want_logits), ranks = two_ranks(path, expert_parallel, long_prefill, "float32")
    for got, got_logits in ranks:
        assert got == want
        scale = np.abs(want_logits).max()
        np.testing.assert_allclose(got_logits, want_logits, rtol=2e-3, atol=2e-3 * scale)
