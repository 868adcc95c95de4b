"""Expert offload's ``mapped`` decode on the CPU backend: calls of few rows run the block with
every expert, the host's as the device reads them in place (on the CPU, whose "device" memory
is host memory, the prepared weights; on a GPU, pinned host bytes: ``backends/cuda/
mapped_weights.py``), so nothing is computed on the host, nothing is read back, and the
all-resident engine's logits come out bit for bit; a prefill chunk still streams through the
window; a placement remakes the block; a host expert the device cannot read so leaves its
block on the host path. Tiny Qwen3.5 MoE, and tiny GLM5Next."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest

from ninfer_format import Artifact
from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.engine import Engine
from ninfer_runtime.expert_offload.stream_window import STREAM_ROWS, ExpertStream
from tests.runtime.offload_runs import CONTEXT, budget_shares, greedy
from tests.runtime.test_expert_offload_stream import HostRows

#: a prompt prefilled in one chunk of more rows than the threshold (the window's path)
PROMPT = np.random.default_rng(5).integers(0, 300, STREAM_ROWS + 8).astype(np.int64)
STEPS = 4


def mapped_engine(path, budget) -> Engine:
    return Engine(
        path,
        max_context=CONTEXT,
        max_lanes=1,
        vram_budget=budget,
        host_expert_cache="1GiB",
        expert_stream_decode="mapped",
    )


@pytest.fixture(scope="module")
def reference(q4_moe):
    return greedy(Engine(q4_moe, max_context=CONTEXT, max_lanes=1).runner, PROMPT, STEPS, 64)


@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_decode_reads_the_host_experts_in_place(q4_moe, shares, reference, fraction):
    floor, experts = shares
    e = mapped_engine(q4_moe, floor + int(fraction * experts))
    offload = e.expert_offload
    assert offload.plan.resident_fraction == fraction
    spy = HostRows(offload.host)
    for block in offload.blocks:
        block.host = spy
        held = [x is not None for x in block.inner.experts]
        assert held == list(block.resident)  # the block itself holds the resident ones
        assert all(x is not None for x in block.in_place.experts)  # its copy every one
        assert set(block.mapped) == block.on_host and block.captures
        assert block.host_experts == {}  # nothing held for the host's own products
    offload.counters.reset()
    streamed = []
    tokens, logits = greedy(
        e.runner, PROMPT, STEPS, 64, lambda: streamed.append(offload.counters.streamed_bytes)
    )
    assert tokens == reference[0]
    np.testing.assert_array_equal(logits, reference[1])  # prefill window and decode alike
    assert spy.rows == [] and offload.counters.host_total == 0
    # the prompt's chunk streamed its host experts; decode steps copied nothing more
    assert (streamed[0] > 0) == (fraction < 1)
    assert offload.counters.streamed_bytes == streamed[0]


def test_steps_stay_capturable(q4_moe, shares):
    """A backend that captures decode steps (``graphs``) keeps them where the device reads
    the host experts in place; computing them on the host turns them eager."""
    from ninfer_runtime.expert_offload import ExpertOffload

    class Capturing(CpuBackend):
        graphs = True

    artifact = Artifact.open(q4_moe)
    names = [n for n in artifact.bindings if n.startswith("text/")]
    floor, _ = shares
    context = mapped_engine(q4_moe, floor).expert_offload.plan.context
    for decode, captured in (("mapped", True), ("off", False)):
        backend = Capturing()
        offload = ExpertOffload(
            floor - context, calibrate=False, host_cache=0, stream_decode=decode
        )
        try:
            offload.plan_load(SimpleNamespace(backend=backend), artifact, names)
        finally:
            offload.close()
        assert not offload.aside and backend.graphs is captured, decode


def test_a_placement_remakes_the_block(q4_moe, shares, reference):
    """Placing the experts again (by other counts) maps the experts that came back to host
    memory, drops those now resident, and keeps every answer."""
    floor, experts = shares
    e = mapped_engine(q4_moe, floor + experts // 2)
    offload = e.expert_offload
    before = {b.layer: set(np.flatnonzero(b.resident)) for b in offload.blocks}
    counts = {b.layer: np.arange(b.experts)[::-1].astype(float) for b in offload.blocks}
    offload.replan(counts)
    after = {b.layer: set(np.flatnonzero(b.resident)) for b in offload.blocks}
    assert after != before
    for block in offload.blocks:
        assert set(block.mapped) == block.on_host and block.host_experts == {}
        assert block.on_host.isdisjoint(after[block.layer])
        assert all(x is not None for x in block.in_place.experts)
    tokens, logits = greedy(e.runner, PROMPT, STEPS, 64)
    assert tokens == reference[0]
    np.testing.assert_array_equal(logits, reference[1])


def test_a_block_the_device_cannot_map_computes_on_the_host(
    q4_moe, shares, reference, monkeypatch, caplog
):
    floor, _ = shares

    def unmappable(self, artifact, names):
        raise ValueError(f"{names[0]}: held as a float32 copy, not stored rows")

    monkeypatch.setattr(CpuBackend, "prepare_mapped", unmappable)
    with caplog.at_level(logging.WARNING, logger="ninfer.expert_offload"):
        e = mapped_engine(q4_moe, floor)
    offload = e.expert_offload
    assert all(b.in_place is None and not b.mapped for b in offload.blocks)
    assert all(set(b.host_experts) == b.on_host for b in offload.blocks)
    assert "host experts computed on the host" in caplog.text
    tokens, _ = greedy(e.runner, PROMPT, STEPS, 64)
    assert tokens == reference[0] and offload.counters.host_total > 0


def test_the_mode_is_offered_where_the_backend_maps():
    """``mapped`` wherever the backend has ``prepare_mapped``; ``auto`` (the default) on a
    GPU, a backend that streams on a second stream: the CPU backend computes host pairs on
    the host unless told, as the split's tests need."""

    class Gpu(CpuBackend):
        def prefetch_experts(self, artifact, groups):
            pass

    stream = ExpertStream(decode="mapped")
    assert stream.maps_on(CpuBackend()) and not stream.spares_host_on(CpuBackend())
    assert not stream.maps_on(object())  # a backend without ``prepare_mapped``
    auto = ExpertStream()
    assert auto.decode == "auto" and auto.maps_on(Gpu()) and not auto.maps_on(CpuBackend())
    assert not any(ExpertStream(decode=d).maps_on(Gpu()) for d in ("all", "off"))


@pytest.fixture(scope="module")
def glm5_next(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests import tiny_glm5_next as tiny

    root = tmp_path_factory.mktemp("glm5_next_mapped")
    tiny.convert("glm5_next_bf16", tiny.build_tiny_glm5_next(root / "ckpt"), root / "m.ninfer")
    return root / "m.ninfer"


def test_glm5_next_reads_its_host_experts_in_place(glm5_next):
    """GLM5Next's block (its routing scales the weights, its expert math clamps) with no
    routed expert resident: the all-resident engine's greedy tokens and logits."""
    floor, _ = budget_shares(glm5_next)
    e = mapped_engine(glm5_next, floor)
    assert e.expert_offload.plan.resident_fraction == 0
    prompt = PROMPT[:12]
    want = greedy(Engine(glm5_next, max_context=CONTEXT, max_lanes=1).runner, prompt, STEPS, 4)
    tokens, logits = greedy(e.runner, prompt, STEPS, 4)
    assert tokens == want[0]
    np.testing.assert_array_equal(logits, want[1])
    assert e.expert_offload.counters.host_total == 0


def test_the_device_counts_the_pairs_it_reads_in_place(q4_moe, shares):
    """A call read in place routes on the device alone, so the block counts its pairs there
    (``ExpertCounters.on_device``): every pair of a step is the device's hit, of the expert
    the router chose (the host path's counts of the same step, expert by expert), and each
    host expert's stored bytes are read once a pair; the totals say so (``/metrics``)."""
    floor, experts = shares
    e = mapped_engine(q4_moe, floor + experts // 2)
    offload = e.expert_offload
    assert 0 < offload.plan.resident_fraction < 1
    host = Engine(
        q4_moe, max_context=CONTEXT, max_lanes=1, vram_budget=floor + experts // 2,
        expert_stream_decode="off",
    )  # fmt: skip
    size = {offload.stream.expert_bytes(b, x) for b in offload.blocks for x in b.on_host}
    assert len(size) == 1  # the tiny model's experts are alike
    counts = []
    for engine in (e, host):
        state = engine.runner.new_state(CONTEXT)
        engine.runner.prefill(PROMPT[:8], state, chunk=8, last_only=True)
        engine.expert_offload.counters.reset()
        engine.runner.forward([np.array([7])], [state])
        counts.append(engine.expert_offload.counters.counts())
    counters = offload.counters
    pairs = len(offload.blocks) * 2  # one row, top-2 in each MoE layer
    assert counters.device_total == pairs and counters.host_total == 0
    for layer, hits in counts[0].items():
        np.testing.assert_array_equal(hits, counts[1][layer])
    on_host = sum(int(counts[0][b.layer][sorted(b.on_host)].sum()) for b in offload.blocks)
    assert 0 < on_host < pairs
    totals = counters.totals()
    assert totals["expert_mapped_bytes"] == on_host * size.pop()
    assert totals["expert_device_hits"] == pairs
    state = e.runner.new_state(CONTEXT)
    e.runner.forward([np.array([9])], [state])
    assert counters.device_total == 2 * pairs  # the next step's too, drained by the read


def test_the_totals_read_the_devices_counts_back_once(monkeypatch):
    """``/metrics`` reads the totals after every step: one copy of the device's counts, not
    one a total."""
    from ninfer_runtime.expert_offload import counters as module

    counters = module.ExpertCounters({0: 4, 1: 4})
    first, second = (counters.on_device(i, np, np.full(4, 10)) for i in (0, 1))
    first[1] += 2  # two pairs of expert 1 in layer 0, one of expert 3 in layer 1
    second[3] += 1
    reads = []
    monkeypatch.setattr(module, "to_numpy", lambda a: reads.append(a) or np.asarray(a))
    totals = counters.totals()
    assert len(reads) == 1
    assert totals["expert_device_hits"] == 3 and totals["expert_mapped_bytes"] == 30


def test_mtp_rounds_keep_greedy_output_reading_in_place(q4_moe):
    """Speculative rounds with the host experts read in place: the verification's rows are a
    call of few rows, so they read them in place too (nothing on the host), and greedy output
    is plain decoding's under the same budget."""
    from ninfer_runtime.engine import GenerationRequest
    from ninfer_runtime.frontend import SamplingParams
    from ninfer_runtime.speculative import SpecConfig
    from tests.runtime.test_engine_many_lanes import run_together

    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [[7, 300, 12, 45, 9, 101], [77, 3, 250, 18, 64, 5, 11, 2, 90]]
    requests = [GenerationRequest(prompt_ids=p, sampling=params) for p in prompts]
    settings = {"max_context": CONTEXT, "max_lanes": 2, "expert_stream_decode": "mapped"}

    def half_resident(**kw):
        plan = Engine(q4_moe, vram_budget="1GiB", **settings, **kw).expert_offload.plan
        budget = plan.weights + plan.workspace + plan.context + plan.resident_bytes // 2
        return Engine(q4_moe, vram_budget=budget, **settings, **kw)

    plain = half_resident()
    rounds = half_resident(spec=SpecConfig(draft_tokens=3))
    assert 0 < rounds.expert_offload.plan.resident_fraction < 1
    assert all(b.in_place is not None for b in rounds.expert_offload.blocks)
    rounds.expert_offload.counters.reset()
    want = run_together(Engine(q4_moe, **{**settings, "expert_stream_decode": None}), requests)
    assert run_together(rounds, requests)[0] == run_together(plain, requests)[0] == want[0]
    assert rounds.spec_stats.rounds > 0
    assert rounds.expert_offload.counters.host_total == 0  # verification read in place too
