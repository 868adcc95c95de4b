"""Expert offload's ``mapped`` decode on the CUDA backend: the host experts' stored bytes in
pinned host memory, which the expert kernels read in place (``backends/cuda/
mapped_weights.py``), so decode steps under a budget are captured as CUDA graphs with no host
work. The tiny Qwen3.5 MoE model with none or some of its routed experts resident decodes,
captured, the all-resident engine's greedy tokens, its logits within ``LOGIT_TOL`` (the same
kernels on the same bytes); a prompt chunk above ``STREAM_ROWS`` still streams through the
window; a replan maps the experts that come back and captures the steps again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.engine import Engine
from ninfer_runtime.expert_offload.stream_window import STREAM_ROWS

from .conftest import REPORT, requires_gpu
from .test_expert_offload_cuda import STEPS, TOP_K, run
from .test_expert_offload_graphs import captured

pytestmark = requires_gpu

PROMPT = np.array([7, 300, 12, 45, 9, 101, 77, 3, 250, 18, 64, 5], dtype=np.int64)
LONG = np.random.default_rng(3).integers(0, 300, STREAM_ROWS + 48).astype(np.int64)
CONTEXT = 160  # (as test_expert_offload_cuda's run reads its prompts)
LAYERS = 4  # the tiny Qwen3.5 MoE model
#: the mapped engine's logits against the all-resident one's, as a fraction of
#: max(1, max|logit|): the same kernels read the same bytes, from host memory instead
LOGIT_TOL = 1e-5
#: cudaMemoryTypeHost: what the runtime says of a pinned host address
HOST_MEMORY = 1


def engine(path: Path, budget: Any = None, decode: str = "mapped") -> Engine:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NINFER_CUDA_GRAPHS", "1")
        return Engine(
            path, backend="cuda", vram_budget=budget, max_context=CONTEXT, max_lanes=1,
            expert_stream_decode=decode,
        )  # fmt: skip


@pytest.fixture(scope="module")
def tiny(gpu_artifact: Callable[[str, str], Path]) -> Path:
    return gpu_artifact("tiny_q4", "moe")


@pytest.fixture(scope="module")
def reference(tiny: Path) -> dict[str, tuple]:
    e = engine(tiny)
    assert e.expert_offload is None
    return {"short": run(e.runner, PROMPT, 8), "long": run(e.runner, LONG, len(LONG))}


def floor_and_experts(path: Path) -> tuple[int, int]:
    """The budget with no routed expert resident and the routed experts' bytes: the plan of
    every expert beside captured steps, with the prefill window's room (two parts of a
    layer's experts: a budget of a few hundred MiB over 16 is more than a tiny layer's). A
    budget that holds the floor without the window and every expert steps aside (nothing
    split), so a split keeps less than half the experts here."""
    plan = engine(path, "64GiB").expert_offload.plan
    window = 2 * (plan.resident_bytes // LAYERS)
    return plan.weights + plan.workspace + plan.context + window, plan.resident_bytes


def close(case: str, want: tuple, got: tuple) -> None:
    scale = max(1.0, float(np.abs(want[1]).max()))
    err = float(np.abs(want[1] - got[1]).max())
    REPORT.append((case, "logits max|Δ| against all resident", f"{err:.2e}"))
    assert got[0] == want[0]
    assert err < LOGIT_TOL * scale


def in_host_memory(e: Engine) -> None:
    """Every host expert's weights lie in pinned host memory, none in device memory."""
    import cupy as cp

    for block in e.expert_offload.blocks:
        for weights in block.mapped.values():
            for w in weights.values():
                for seg in w.segments:
                    ptr = seg.parent.data.data.ptr
                    assert cp.cuda.runtime.pointerGetAttributes(ptr).type == HOST_MEMORY


@pytest.mark.parametrize("share", [0.0, 0.25])
def test_captured_steps_read_host_experts_in_place(tiny, reference, share):
    floor, experts = floor_and_experts(tiny)
    e = engine(tiny, floor + int(share * experts))
    offload = e.expert_offload
    assert not offload.aside and offload.plan.resident_fraction < 1
    assert (offload.plan.resident_fraction == 0) == (share == 0)
    assert all(b.captures and b.in_place is not None for b in offload.blocks)
    assert e.runner.model.backend.graphs is True
    in_host_memory(e)
    offload.counters.reset()
    got = run(e.runner, PROMPT, 8)
    assert captured(e), "no decode step was captured"
    counters = offload.counters
    assert counters.host_total == 0 and counters.streamed_bytes == 0
    # every pair counted on the device, captured steps' too; the host experts' read in place
    pairs = (len(PROMPT) + STEPS) * TOP_K * LAYERS
    assert counters.device_total == pairs
    size = {offload.stream.expert_bytes(b, x) for b in offload.blocks for x in b.on_host}
    assert len(size) == 1  # the tiny model's experts are alike
    read = counters.mapped_bytes
    assert read == pairs * size.pop() if share == 0 else 0 < read < pairs * size.pop()
    close(f"offload/mapped-{offload.plan.resident_fraction:.0%} resident", reference["short"], got)
    long = run(e.runner, LONG, len(LONG))  # the chunk streams through the window; decode maps
    assert offload.counters.streamed_bytes > 0 and offload.counters.host_total == 0
    close("offload/mapped, a streamed chunk", reference["long"], long)


def test_a_replan_maps_the_experts_that_come_back(tiny, reference):
    floor, experts = floor_and_experts(tiny)
    e = engine(tiny, floor + experts // 4)
    run(e.runner, PROMPT, 8)
    offload = e.expert_offload
    assert not offload.aside and 0 < offload.plan.resident_fraction < 1
    backend = e.runner.model.backend
    epoch = backend.graph_epoch
    offload.replan({b.layer: np.where(b.resident, 0, 1) for b in offload.blocks})
    assert backend.graph_epoch > epoch
    for block in offload.blocks:
        assert set(block.mapped) == block.on_host and block.host_experts == {}
    in_host_memory(e)
    got = run(e.runner, PROMPT, 8)
    assert captured(e)
    close("offload/mapped, replanned", reference["short"], got)


def test_mtp_rounds_keep_greedy_output_with_offload(tiny):
    """Speculative rounds under a budget that keeps a quarter of the experts, their host
    experts read in place (``auto``, the default on a GPU): the verification's rows take the
    same path as decode's, and greedy output is plain decoding's under the same budget. (The
    host's products, ``off``, take MTP rounds in tests/runtime/test_expert_offload_stream.py:
    on the GPU no budget splits this tiny model's experts on that path, whose workspace
    estimate outgrows every expert's bytes: its smallest budget keeps them all.)"""
    from ninfer_runtime.engine import GenerationRequest
    from ninfer_runtime.frontend import SamplingParams
    from ninfer_runtime.speculative import SpecConfig
    from tests.runtime.test_engine_many_lanes import run_together

    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [[7, 300, 12, 45, 9, 101], [77, 3, 250, 18, 64, 5, 11, 2, 90]]
    requests = [GenerationRequest(prompt_ids=p, sampling=params) for p in prompts]

    def quarter_resident(**kw: Any) -> Engine:
        """An engine of these settings keeping a quarter of its routed experts (its own
        context pool and the window's room in the floor: drafts take pages of their own)."""
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("NINFER_CUDA_GRAPHS", "1")
            settings = dict(backend="cuda", max_context=CONTEXT, max_lanes=2)
            plan = Engine(tiny, vram_budget="64GiB", **settings, **kw).expert_offload.plan
            window = 2 * (plan.resident_bytes // LAYERS)
            floor = plan.weights + plan.workspace + plan.context + window
            return Engine(tiny, vram_budget=floor + plan.resident_bytes // 4, **settings, **kw)

    plain = quarter_resident()
    rounds = quarter_resident(spec=SpecConfig(draft_tokens=3))
    assert rounds.expert_offload.plan.resident == plain.expert_offload.plan.resident
    assert 0 < rounds.expert_offload.plan.resident_fraction < 1
    assert all(b.in_place is not None for b in rounds.expert_offload.blocks)
    assert run_together(rounds, requests)[0] == run_together(plain, requests)[0]
    stats = rounds.spec_stats
    assert stats.rounds > 0 and stats.drafted == stats.rounds * 3
