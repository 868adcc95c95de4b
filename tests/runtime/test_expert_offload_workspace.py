"""The backend's device workspace in a ``--vram-budget`` plan: a backend stating one (at the
engine's prefill chunk) takes exactly its bytes from the routed experts' room, a budget too
small for it is refused naming it; the CUDA backend's estimate for the official geometries;
the CPU backend states none."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest

from ninfer_format import Artifact
from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.backends.cuda.workspace import SCRATCH_BYTES, prefill_workspace, router_copies
from ninfer_runtime.bench.geometries import GEOMETRIES
from ninfer_runtime.engine import Engine
from ninfer_runtime.expert_offload import (
    ExpertOffload,
    OffloadPlan,
    VramBudgetError,
    WeightSizes,
)
from ninfer_runtime.logprobs import PROMPT_LOGPROB_CHUNK
from ninfer_runtime.sizes import format_size
from tests.runtime.offload_runs import CONTEXT, engine

GiB = 1 << 30


class StatedWorkspace(CpuBackend):
    """The CPU backend, stating ``nbytes`` of device workspace as a GPU backend would."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.asked: list[tuple[Any, int]] = []

    def device_workspace(self, config: Any, rows: int, logit_rows: int) -> int:
        self.asked.append((config, rows, logit_rows))
        return self.nbytes


def text_names(artifact: Artifact) -> list[str]:
    return [n for n in artifact.bindings if n.startswith("text/")]


def first_plan(path: Any, backend: Any, budget: int, rows: int = 2048) -> OffloadPlan:
    """The plan ``plan_load`` makes for the artifact's text parameters on ``backend``, for
    prefill calls of ``rows`` rows whether experts stream or not."""
    artifact = Artifact.open(path)
    offload = ExpertOffload(
        budget, calibrate=False, host_cache=0, prefill_rows=rows, stream_chunk=rows
    )
    try:
        offload.plan_load(SimpleNamespace(backend=backend), artifact, text_names(artifact))
    finally:
        offload.close()
    assert offload.plan is not None
    return offload.plan


def test_a_stated_workspace_takes_exactly_its_bytes_from_the_experts(q4_moe):
    artifact = Artifact.open(q4_moe)
    sizes = WeightSizes.measure(artifact, text_names(artifact))
    (per_expert,) = {size for per in sizes.experts.values() for size in per}  # all alike
    budget = sizes.other + sizes.expert_total  # every expert resident, no workspace
    assert first_plan(q4_moe, CpuBackend(), budget).resident_fraction == 1
    backend = StatedWorkspace(3 * per_expert)
    plan = first_plan(q4_moe, backend, budget, rows=1024)
    # a scored prompt's chunk is the most rows that get logits
    assert backend.asked == [(artifact.components["text"].config, 1024, PROMPT_LOGPROB_CHUNK)]
    assert plan.workspace == 3 * per_expert
    assert sum(len(r) for r in plan.resident.values()) == sum(plan.experts.values()) - 3
    assert plan.resident_bytes == sizes.expert_total - 3 * per_expert


def test_a_budget_too_small_for_the_workspace_is_refused_naming_it(q4_moe):
    floor = first_plan(q4_moe, CpuBackend(), 1 * GiB).weights
    workspace = 5 << 20
    with pytest.raises(VramBudgetError) as exc:
        first_plan(q4_moe, StatedWorkspace(workspace), floor + workspace - 1)
    message = str(exc.value)
    assert "\n" not in message
    assert f"workspace {format_size(workspace)}" in message
    smallest = re.search(r"smallest budget that works is .* \((\d+) bytes\)", message)
    assert smallest and int(smallest[1]) == floor + workspace
    plan = first_plan(q4_moe, StatedWorkspace(workspace), floor + workspace)
    assert plan.resident_fraction == 0


def test_the_engine_plans_the_workspace_at_its_prefill_chunk(q4_moe, shares):
    floor, experts = shares
    backend = StatedWorkspace(experts // 2)
    e = Engine(
        q4_moe,
        backend=backend,  # type: ignore[arg-type]
        max_context=CONTEXT,
        max_lanes=1,
        prefill_chunk=24,
        expert_stream_chunk=24,  # (a longer one is test_expert_offload_chunk.py's)
        vram_budget=floor + experts,
        host_expert_cache=0,
    )
    assert [asked[1:] for asked in backend.asked] == [(24, 24)]  # a scored chunk: every row
    plan = e.expert_offload.plan
    assert plan.workspace == experts // 2 and plan.resident_bytes <= experts - experts // 2


def test_the_cpu_backend_states_no_workspace(q4_moe):
    """So every plan on the CPU is what it was before backends stated workspaces."""
    assert CpuBackend().device_workspace(GEOMETRIES["qwen3_6_35b_a3b"], 2048, 256) == 0
    plan = engine(q4_moe, "1GiB").expert_offload.plan
    assert plan.workspace == 0 and plan.context > 0


@pytest.mark.parametrize("name", ["qwen3_6_27b", "qwen3_6_35b_a3b"])
def test_the_cuda_estimate_of_the_official_geometries(name):
    """At a 2,048-row chunk with decode graphs off (as offload runs): two scratch slabs
    (256 MiB), the MoE routers' copies on the 35B-A3B, and the widest point: the 27B's Gated
    DeltaNet layer, the 35B-A3B's MoE block (a scored chunk's 256 rows of 248,320 float32
    logits, 243 MiB, are narrower than either)."""
    config = GEOMETRIES[name]
    at = {r: prefill_workspace(config, r, 256, captured=False) for r in (512, 2048, 4096)}
    assert 0.5 * GiB < at[2048] < 1.5 * GiB
    assert at[512] < at[2048] < at[4096]
    assert prefill_workspace(config, 2048, 256) == at[2048] + SCRATCH_BYTES  # graphs: one more
    logits = 256 * config["vocab_size"] * 4
    assert at[2048] > 2 * SCRATCH_BYTES + router_copies(config) + logits
    # every row scored (a chunk of 2,048 scored rows) would cost the logits of every row
    every = prefill_workspace(config, 2048, 2048, captured=False)
    assert every - at[2048] >= (2048 - 256) * config["vocab_size"] * 4 - GiB // 2
    if name == "qwen3_6_35b_a3b":  # 40 layers' and a window's 4 x [257, 2048] float32
        assert router_copies(config) == 41 * 4 * 257 * 2048 * 4
    else:
        assert router_copies(config) == 0


def test_array_math_attentions_plan_a_block_of_scores():
    """An attention layer whose selection and attention are array math a block of queries
    at a time (Qwen4Exp's QSA, GLM5Next's latent attention) plans that block's scores: with
    the dense layers narrow, the widest point is the attention's, one block more than a
    plain attention layer's."""
    from ninfer_runtime.backends.cuda.workspace import SCORE_BLOCK_COPIES
    from ninfer_runtime.functional import SCORE_BLOCK_BYTES

    plain = {
        "hidden_size": 1024, "num_hidden_layers": 2, "vocab_size": 1000,
        "intermediate_size": 64, "num_attention_heads": 16, "head_dim": 128,
        "num_key_value_heads": 2,
    }  # fmt: skip
    qsa = {**plain, "indexer_budget": 2048}
    block = SCORE_BLOCK_COPIES * SCORE_BLOCK_BYTES
    got = {name: prefill_workspace(c, 2048, 1, captured=False) for name, c in
           (("plain", plain), ("qsa", qsa))}  # fmt: skip
    assert got["qsa"] - got["plain"] == block
    latent = {**plain, "kv_lora_rank": 512, "q_lora_rank": 256, "qk_nope_head_dim": 128,
              "v_head_dim": 128, "index_n_heads": 8, "index_head_dim": 64}  # fmt: skip
    assert prefill_workspace(latent, 2048, 1, captured=False) - got["plain"] > block
