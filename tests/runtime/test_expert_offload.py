"""Expert offload on the CPU backend: the tiny Qwen3.5 MoE model under budgets that keep none,
half or all of its routed experts resident gives the all-resident logits (within float32
rounding: the host's partial sums are added apart) and the same greedy tokens; host experts
are the stored codes; calibration is deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_format import Artifact
from ninfer_format.schema import Tensor
from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.engine import Engine
from ninfer_runtime.expert_offload import VramBudgetError, WeightSizes
from ninfer_runtime.expert_offload.host_cache import hold_hottest
from ninfer_runtime.expert_offload.host_experts import HostExpert
from ninfer_runtime.expert_offload.plan import routed_expert
from ninfer_runtime.expert_offload.stream_window import ExpertStream
from ninfer_runtime.runner import ModelRunner
from tests.runtime.offload_runs import CONTEXT, budget_shares, engine
from tests.runtime.offload_runs import greedy as greedy_run

PROMPT = np.array([7, 300, 12, 45, 9, 101, 77, 3, 250, 18, 64, 5], dtype=np.int64)


def greedy(runner: ModelRunner, tokens: int) -> tuple[list[int], np.ndarray]:
    """The prompt in two chunks, then ``tokens`` greedy steps."""
    return greedy_run(runner, PROMPT, tokens)


@pytest.fixture(scope="module")
def reference(q4_moe):
    return greedy(Engine(q4_moe, max_context=CONTEXT, max_lanes=1).runner, 6)


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_residency_leaves_logits_and_greedy_tokens(q4_moe, shares, reference, fraction):
    floor, experts = shares
    e = engine(q4_moe, floor + int(fraction * experts))
    offload = e.expert_offload
    assert offload.plan.resident_fraction == fraction
    offload.counters.reset()
    tokens, logits = greedy(e.runner, 6)
    assert tokens == reference[0]
    np.testing.assert_allclose(logits, reference[1], rtol=0, atol=1e-4)
    if fraction == 1.0:  # the same op on the same weights: exactly the same numbers
        np.testing.assert_array_equal(logits, reference[1])
    counters = offload.counters
    assert (counters.device_total > 0) == (fraction > 0)
    assert (counters.host_total > 0) == (fraction < 1)
    # the host read each chosen host expert's stored bytes once a block call
    assert (counters.host_bytes > 0) == (fraction < 1)
    one = (
        min(x.nbytes for b in offload.blocks for x in b.host_experts.values())
        if fraction < 1
        else 0
    )
    assert counters.host_bytes >= one
    # every routed pair is counted once, wherever it ran: (12 + 6 tokens) x top-2 x 4 layers
    assert counters.device_total + counters.host_total == (len(PROMPT) + 6) * 2 * 4


def test_a_resident_share_keeps_experts_on_the_host_under_a_budget_that_holds_all(
    q4_moe, shares, reference
):
    """``resident_share`` (a benchmark's reduced artifact given the whole model's share)
    keeps no more than that share of the experts' bytes resident, at load and when placed
    again, whatever room the budget has; the numbers stay."""
    from ninfer_runtime.expert_offload import ExpertOffload
    from ninfer_runtime.models import load_model

    floor, experts = shares
    offload = ExpertOffload.for_budget(floor + 2 * experts, "cpu", resident_share=0.5)
    model = load_model(q4_moe, CpuBackend(), expert_offload=offload)
    assert offload.plan.resident_fraction == 0.5
    assert offload.plan.resident_bytes <= experts // 2 < offload.plan.budget - floor
    tokens, logits = greedy(ModelRunner(model), 6)
    assert tokens == reference[0]
    np.testing.assert_allclose(logits, reference[1], rtol=0, atol=1e-4)
    assert offload.replan().resident_fraction == 0.5


def test_a_budget_below_the_floor_is_refused_before_loading(q4_moe, shares, monkeypatch):
    floor, _ = shares
    prepared: list[str] = []
    real = CpuBackend.prepare
    monkeypatch.setattr(
        CpuBackend, "prepare", lambda be, art, names: real(be, art, prepared.extend(names) or names)
    )
    with pytest.raises(VramBudgetError, match=f"smallest budget that works is .* \\({floor} "):
        engine(q4_moe, floor - 1)
    assert prepared == []  # planned from stored sizes: no weight was loaded


def test_the_plan_comes_first_and_only_resident_experts_load(q4_moe, shares, monkeypatch):
    """The pool the engine makes is the one planned; a routed expert the plan keeps on the
    host is never prepared (until a later plan makes it resident, or a long prefill chunk
    streams it through the window, which calibration's prefill would: turned off here)."""
    floor, _ = shares
    prepared: list[str] = []
    real = CpuBackend.prepare
    monkeypatch.setattr(
        CpuBackend, "prepare", lambda be, art, names: real(be, art, prepared.extend(names) or names)
    )
    monkeypatch.setattr(ExpertStream, "takes", lambda stream, rows: False)
    e = Engine(q4_moe, max_context=CONTEXT, max_lanes=1, vram_budget=floor, host_expert_cache=0)
    assert e.expert_offload.plan.context == e.pool.nbytes() > 0
    assert not any(routed_expert(name) for name in prepared)
    assert e.expert_offload.host_cache == 0


def test_calibration_is_deterministic_and_keeps_the_most_chosen(q4_moe, shares):
    floor, experts = shares
    plans = [engine(q4_moe, floor + experts // 4).expert_offload for _ in range(2)]
    assert plans[0].plan.resident == plans[1].plan.resident
    plan, counts = plans[0].plan, plans[0].priority
    for layer in counts:
        np.testing.assert_array_equal(counts[layer], plans[1].priority[layer])
    assert sum(map(len, plan.resident.values())) == 4  # a quarter of 4 layers x 4 experts
    # the experts are the same size: the resident ones are the most chosen of all layers
    resident = [counts[layer][e] for layer, kept in plan.resident.items() for e in kept]
    host = [counts[layer][e] for layer in counts for e in plan.host(layer)]
    assert min(resident) >= max(host) and sum(resident) > sum(host) / 3


def test_replanning_by_the_counts_the_engine_kept(q4_moe, shares, reference):
    """After a workload, the experts it chose most move to the device; the numbers stay."""
    floor, experts = shares
    e = engine(q4_moe, floor + experts // 2)
    e.expert_offload.counters.reset()
    greedy(e.runner, 6)
    counts = e.expert_offload.counters.counts()
    plan = e.expert_offload.replan()
    resident = [counts[layer][x] for layer, kept in plan.resident.items() for x in kept]
    host = [counts[layer][x] for layer in counts for x in plan.host(layer)]
    assert len(resident) == 8 and min(resident) >= max(host)
    tokens, logits = greedy(e.runner, 6)
    assert tokens == reference[0]
    np.testing.assert_allclose(logits, reference[1], rtol=0, atol=1e-4)


def test_host_experts_compute_by_blocks_and_the_hottest_hold_decoded_copies(q4_moe, reference):
    """A host expert cut into intermediate blocks gives the whole expert's rows (its products
    summed in another order); the hottest experts within the allowance keep decoded copies,
    and the engine's tokens do not depend on how many do."""
    art = Artifact.open(q4_moe)
    experts = [HostExpert.load(art, f"text/layers/0/moe/experts/{i}/") for i in range(3)]
    x = np.random.default_rng(0).standard_normal((3, experts[0].hidden)).astype(np.float32)
    for expert in experts:
        assert expert.blocks is not None and expert.held is None
        whole = expert.math(x, *expert.weights())
        np.testing.assert_allclose(expert(x), whole, rtol=1e-5, atol=1e-6)
    size = experts[0].decoded_bytes
    assert hold_hottest([(1.0, experts[0]), (5.0, experts[1]), (3.0, experts[2])], 2 * size) == (
        2 * size
    )
    assert [e.held is not None for e in experts] == [False, True, True]
    np.testing.assert_array_equal(experts[1](x), experts[1].math(x, *experts[1].weights()))
    for allowance in (0, "1GiB"):
        e = Engine(
            q4_moe, max_context=CONTEXT, max_lanes=1, vram_budget=budget_shares(q4_moe)[0],
            host_expert_cache=allowance,
        )  # fmt: skip
        held = [
            x.held is not None for b in e.expert_offload.blocks for x in b.host_experts.values()
        ]
        assert len(held) == 16 and all(held) == (allowance != 0) and any(held) == all(held)
        assert greedy(e.runner, 6)[0] == reference[0]
    # room for five copies: the five most chosen experts (by the calibration counts) hold one
    e = Engine(
        q4_moe, max_context=CONTEXT, max_lanes=1, vram_budget=budget_shares(q4_moe)[0],
        host_expert_cache=5 * size,
    )  # fmt: skip
    counts = e.expert_offload.priority
    hits = {
        x.held is not None: [] for b in e.expert_offload.blocks for x in b.host_experts.values()
    }
    for b in e.expert_offload.blocks:
        for x, expert in b.host_experts.items():
            hits[expert.held is not None].append(counts[b.layer][x])
    assert len(hits[True]) == 5 and min(hits[True]) >= max(hits[False])


@pytest.mark.parametrize("recipe", ["tiny_q4", "tiny_mixed"])
def test_host_experts_decode_to_the_loaded_weights(artifact_path, recipe):
    """Stored codes cut per expert (q4; the mixed recipe's NVFP4 gate and up, whole 128-row
    scale tiles, and FP8 down, row scales), decoding to the weights the backend would load."""
    art = Artifact.open(artifact_path(recipe, "moe"))
    prefix = "text/layers/2/moe/experts/3/"
    expert = HostExpert.load(art, prefix)
    for part, weight in zip(("gate", "up", "down"), expert.weights(), strict=True):
        want = art.parameter(prefix + part, in_order=True)
        np.testing.assert_array_equal(weight, want)
    assert not expert.decoded
    parts = ("gate", "up") if recipe == "tiny_q4" else ("gate", "up", "down")
    stored = sum(int(np.prod(art.binder_report.parameters[prefix + p])) for p in parts)
    assert expert.nbytes < stored  # q4, NVFP4 and FP8 codes: under a byte a weight


def test_a_host_weight_cut_from_a_bank_with_a_divisor_per_expert_decodes_with_its_own():
    """An imported NVFP4 bank stacks experts with a weight divisor each: a piece cut from it
    holds the divisors of the experts its rows come from, and decodes with them."""
    from ninfer_format.codecs import codec_for
    from ninfer_runtime.expert_offload.stored_weights import StoredRows, _cut_stored

    codec = codec_for("nvfp4", "block_scale_k16_m128x4_v1")
    values = np.random.default_rng(1).standard_normal((768, 128)).astype(np.float32)
    values[256:512] *= 50
    data = np.frombuffer(codec.encode(values, 3), dtype=np.uint8)
    bank = StoredRows(codec.format, codec.layout, data, (768, 128))
    whole = codec.decode(data, (768, 128), 3)
    np.testing.assert_array_equal(bank.decode(), whole)
    for rows, columns in (((256, 512), (0, 128)), ((0, 512), (64, 128)), ((384, 512), (0, 64))):
        piece = _cut_stored(bank, rows, columns)
        block = whole[rows[0] : rows[1], columns[0] : columns[1]]
        np.testing.assert_array_equal(piece.decode(), block)


@pytest.mark.parametrize("recipe", ["tiny_q4", "tiny_mixed"])
def test_stored_sizes_share_out_the_objects(artifact_path, recipe):
    """Each expert takes its share of the packed bank's bytes; all parameters together take
    the artifact's tensor bytes (up to a byte a share, where a share is not whole)."""
    art = Artifact.open(artifact_path(recipe, "moe"))
    sizes = WeightSizes.measure(art, list(art.bindings))
    total = sum(o.bytes for o in art.objects.values() if isinstance(o, Tensor))
    assert 0 <= sizes.other + sizes.expert_total - total <= len(art.bindings)
    assert sorted(sizes.experts) == [0, 1, 2, 3]
    assert all(len(set(per)) == 1 and len(per) == 4 for per in sizes.experts.values())


def test_ninfer_takes_the_budget_from_the_flag_or_the_environment(q4_moe, monkeypatch):
    from click.testing import CliRunner

    from ninfer_runtime.cli import main

    args = [str(q4_moe), "--prompt", "Hi", "--raw", "--greedy", "--max-tokens", "2"]
    refused = CliRunner().invoke(main, [*args, "--vram-budget", "100KiB"])
    assert refused.exit_code == 1
    assert refused.output.count("\n") == 1 and "smallest budget that works" in refused.output
    monkeypatch.setenv("NINFER_VRAM_BUDGET_MIB", "0.25")
    assert "--vram-budget 256 KiB is below" in CliRunner().invoke(main, args).output
    bad = CliRunner().invoke(main, [*args, "--vram-budget", "8GiB", "--host-expert-cache", "x"])
    assert bad.exit_code == 1 and "host expert cache 'x'" in bad.output
