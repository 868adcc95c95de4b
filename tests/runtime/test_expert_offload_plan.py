"""The expert offload planner, the host path's split combine and the budget settings, on
made-up sizes and experts (no artifact)."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.errors import EngineError
from ninfer_runtime.expert_offload import (
    NOT_SERVED,
    ExpertOffload,
    VramBudgetError,
    WeightSizes,
    plan_residency,
    vram_budget_setting,
)
from ninfer_runtime.expert_offload.host_experts import HostCompute
from ninfer_runtime.expert_offload.plan import routed_expert

#: three MoE layers of four experts, 100 bytes each; 1000 bytes of other weights
SIZES = WeightSizes({0: [100] * 4, 1: [100] * 4, 2: [100] * 4}, other=1000)


def test_a_budget_below_the_other_weights_is_refused_naming_the_smallest_that_works():
    floor = 1000 + 50 + 200  # weights + workspace + context pool
    with pytest.raises(VramBudgetError) as exc:
        plan_residency(SIZES, floor - 1, workspace=50, context=200)
    message = str(exc.value)
    assert "\n" not in message
    assert f"the smallest budget that works is 1.22 KiB ({floor} bytes)" in message
    plan = plan_residency(SIZES, floor, workspace=50, context=200)
    assert plan.resident_fraction == 0 and plan.host_bytes == 1200
    assert plan.host(1) == (0, 1, 2, 3)
    everything = plan_residency(SIZES, floor + 1200, workspace=50, context=200)
    assert everything.resident_fraction == 1 and everything.host_bytes == 0


def test_without_counts_the_layers_fill_evenly():
    plan = plan_residency(SIZES, 1000 + 650)  # room for six and a half experts
    assert plan.resident == {0: (0, 1), 1: (0, 1), 2: (0, 1)}
    assert plan.resident_bytes == 600 and plan.host_bytes == 600


def test_a_most_keeps_no_more_experts_resident_than_it_says():
    plan = plan_residency(SIZES, 1000 + 1200, most=650)  # the budget holds all twelve
    assert plan.resident == {0: (0, 1), 1: (0, 1), 2: (0, 1)} and plan.resident_bytes == 600
    assert plan_residency(SIZES, 1000 + 350, most=650).resident_bytes == 300  # the budget's


def test_counts_keep_the_most_chosen_experts_per_byte():
    counts = {0: [1, 9, 0, 5], 1: [2, 2, 2, 2], 2: [0, 0, 30, 0]}
    plan = plan_residency(SIZES, 1000 + 400, counts=counts)
    # by hits: layer 2 expert 2 (30), layer 0 expert 1 (9), layer 0 expert 3 (5), then the
    # first of layer 1's equal twos
    assert plan.resident == {0: (1, 3), 1: (0,), 2: (2,)}
    # a bigger expert with the same hits waits for the smaller ones
    sizes = WeightSizes({0: [100, 300], 1: [100, 100]}, other=0)
    plan = plan_residency(sizes, 300, counts={0: [1, 1], 1: [1, 1]})
    assert plan.resident == {0: (0,), 1: (0, 1)}
    with pytest.raises(EngineError, match="expert counts of layer 0: 3 values for 4"):
        plan_residency(SIZES, 5000, counts={0: [1, 2, 3]})


def test_routed_expert_names():
    assert routed_expert("text/layers/12/moe/experts/7/down") == (12, 7)
    assert routed_expert("text/layers/12/moe/shared/down") is None
    assert routed_expert("mtp/layers/0/moe/experts/7/down") is None  # stays with the rest


@pytest.mark.parametrize("threads", [1, 3])
def test_host_pairs_keep_the_routers_weights(threads):
    """Only the host's experts' pairs, each times its own routing weight: a row whose other
    expert is resident is not renormalised onto the host's one."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    top = np.array([[0, 1], [2, 3], [1, 0], [3, 2], [0, 3]])
    share = rng.uniform(0.1, 0.9, size=(5, 2)).astype(np.float32)
    experts = {1: lambda v: 2 * v, 3: lambda v: -v}  # the host holds experts 1 and 3
    host = HostCompute(threads)
    try:
        out = host(x, top, share, experts)
        assert host(x, np.zeros_like(top), share, experts) is None  # none of its experts
    finally:
        host.close()
    want = np.zeros_like(x)
    for row in range(5):
        for slot in range(2):
            e = int(top[row, slot])
            if e in experts:
                want[row] += share[row, slot] * experts[e](x[row])
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_budget_settings_from_a_size_or_the_environment():
    assert vram_budget_setting("8GiB", {}) == 8 << 30
    assert vram_budget_setting("512MiB", {"NINFER_VRAM_BUDGET_MIB": "1"}) == 512 << 20
    assert vram_budget_setting(None, {"NINFER_VRAM_BUDGET_MIB": "1536"}) == 1536 << 20
    assert vram_budget_setting(None, {}) is None
    with pytest.raises(EngineError, match=r"\$NINFER_VRAM_BUDGET_MIB '8GiB': expected a number"):
        vram_budget_setting(None, {"NINFER_VRAM_BUDGET_MIB": "8GiB"})
    with pytest.raises(EngineError, match="vram budget 'lots'"):
        vram_budget_setting("lots", {})


def test_a_backend_offload_is_not_served_on_refuses_a_budget_in_one_line():
    with pytest.raises(EngineError, match=NOT_SERVED) as exc:
        ExpertOffload.for_budget("8GiB", "elsewhere")
    assert "\n" not in str(exc.value) and "--backend elsewhere" in str(exc.value)
    with pytest.raises(EngineError, match="--tensor-parallel is not built"):
        ExpertOffload.for_budget("8GiB", "cpu", tensor_parallel=2)
    assert ExpertOffload.for_budget(None, "cuda") is None
