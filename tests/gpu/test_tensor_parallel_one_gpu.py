"""The ranks' math on the CUDA backend where one GPU is all there is: two ranks as threads
sharing it, each with its own backend (graphs off) and its share of the model (heads and
split experts, or with expert parallelism its experts whole: the stand-in entries and zeroed
shares of ``moe.ExpertTable``), combined by ``ThreadGroup``'s collectives over device arrays
instead of NCCL. They give one rank's greedy tokens; the NCCL run over two GPUs is
``test_tensor_parallel_cuda.py``."""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtime.test_tensor_parallel import each_rank

from .conftest import REASON
from .test_tensor_parallel_cuda import greedy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


@pytest.mark.parametrize(
    ("recipe", "kind", "expert_parallel"),
    [
        ("tiny_mixed", "dense", False),
        ("tiny_mixed", "moe", False),
        ("tiny_mixed", "moe", True),  # NVFP4 / fp8 experts: banks uploaded whole
        ("tiny_q4", "moe", True),  # q4 experts: each rank uploads its experts' rows only
    ],
    ids=["dense", "moe-split-experts", "moe-whole-experts", "moe-whole-experts-q4"],
)
def test_two_ranks_on_one_gpu_give_one_ranks_greedy_tokens(
    gpu_artifact, recipe, kind, expert_parallel
) -> None:
    from ninfer_runtime.backends.cuda.backend import CudaBackend
    from ninfer_runtime.models import load_model
    from ninfer_runtime.parallel import ThreadGroup
    from ninfer_runtime.runner import ModelRunner

    path = gpu_artifact(recipe, kind)
    want, want_logits = greedy(ModelRunner(load_model(path, CudaBackend(graphs=False))), 12)
    group = ThreadGroup(2, timeout=120)
    runners = [
        ModelRunner(load_model(path, CudaBackend(graphs=False), group.rank(r), expert_parallel))
        for r in range(2)
    ]
    if expert_parallel:
        experts = runners[0].model.config.moe.experts
        assert runners[1].model.config.moe.held == range(experts // 2, experts)
    ranks = each_rank(group, lambda rank: greedy(runners[rank.rank], 12))
    for got, got_logits in ranks:
        assert got == want
        for a, b in zip(got_logits, want_logits, strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3 * np.abs(b).max())
