"""Expert offload's prefill window on the CPU backend: a prefill chunk of more than
``STREAM_ROWS`` token rows streams the host experts it routes to through the (simulated)
device, in one part or in several within a window's bytes, and gives the all-resident logits
(bit for bit in one part) and the same greedy tokens; its pairs are device pairs and its bytes
are counted; decode's few rows still take the host path, unless on a GPU-like backend the host
has no kernel for a host expert they route to (then they stream too, without prefetching).
Tiny Qwen3.5 MoE, and tiny GLM5Next for a block whose routing scales its weights and whose
expert math clamps."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ninfer_format import Artifact
from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.cli_options import EXPERT_STREAM_ROWS_HELP
from ninfer_runtime.engine import Engine
from ninfer_runtime.expert_offload import WeightSizes
from ninfer_runtime.expert_offload.stream_window import STREAM_ROWS, default_window
from ninfer_runtime.runner import ModelRunner
from tests.runtime.offload_runs import CONTEXT, budget_shares, engine, greedy

#: a prompt prefilled in one chunk of more rows than the threshold
PROMPT = np.random.default_rng(3).integers(0, 300, STREAM_ROWS + 8).astype(np.int64)
STEPS = 4
LAYERS, TOP_K = 4, 2  # the tiny Qwen3.5 MoE model
WEIGHTS = ("gate", "up", "down")


def prefill_then_greedy(
    runner: ModelRunner, chunk: int, after_prefill=lambda: None
) -> tuple[list[int], np.ndarray]:
    """The prompt in chunks of ``chunk`` rows, then ``STEPS`` greedy steps."""
    return greedy(runner, PROMPT, STEPS, chunk, after_prefill)


@pytest.fixture(scope="module")
def reference(q4_moe):
    return prefill_then_greedy(Engine(q4_moe, max_context=CONTEXT, max_lanes=1).runner, 64)


class HostRows:
    """Wraps the offload's host compute, keeping the token rows of each call it gets."""

    def __init__(self, host):
        self.host, self.rows = host, []

    def __call__(self, x, *args):
        self.rows.append(len(x))
        return self.host(x, *args)


def spy_on_host(e: Engine) -> HostRows:
    spy = HostRows(e.expert_offload.host)
    for block in e.expert_offload.blocks:
        block.host = spy
    return spy


@pytest.mark.parametrize("window_experts", [None, 1, 3])
@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_a_long_prefill_streams_its_experts_and_decode_stays_on_the_host(
    q4_moe, shares, reference, fraction, window_experts
):
    floor, experts = shares
    e = engine(q4_moe, floor + int(fraction * experts))
    offload = e.expert_offload
    assert offload.plan.resident_fraction == fraction
    if window_experts is not None:  # the window in parts of this many experts (all alike)
        offload.stream.window_bytes = window_experts * experts // (LAYERS * 4)
    offload.counters.reset()
    spy = spy_on_host(e)
    streamed: list[int] = []

    def after_prefill():
        counters = offload.counters
        streamed.append(counters.streamed_bytes)
        assert spy.rows == [] and counters.host_total == 0  # no row on the host path
        assert counters.device_total == len(PROMPT) * TOP_K * LAYERS
        # streamed: every host expert the chunk routed to, each once a layer
        assert 0 < counters.streamed_bytes <= (1 - fraction) * experts

    tokens, logits = prefill_then_greedy(e.runner, 64, after_prefill)
    assert tokens == reference[0]
    np.testing.assert_allclose(logits, reference[1], rtol=0, atol=1e-4)
    if window_experts is None:  # the block's own call with the window in place
        np.testing.assert_array_equal(logits[0], reference[1][0])
    # decode: one row a call, on the host path, streaming nothing more
    assert spy.rows and max(spy.rows) == 1 and offload.counters.host_total > 0
    assert offload.counters.streamed_bytes == streamed[0]


def test_a_chunk_of_threshold_rows_stays_on_the_host(q4_moe, shares):
    floor, _ = shares
    e = engine(q4_moe, floor)
    e.expert_offload.counters.reset()
    spy = spy_on_host(e)
    state = e.runner.new_state(CONTEXT)
    e.runner.prefill(PROMPT[:STREAM_ROWS], state, chunk=STREAM_ROWS, last_only=True)
    assert spy.rows and max(spy.rows) == STREAM_ROWS
    assert e.expert_offload.counters.streamed_bytes == 0


def test_the_threshold_is_an_engine_option(q4_moe, shares):
    """``Engine(expert_stream_rows=...)`` (``[engine] expert_stream_rows``,
    ``--expert-stream-rows``): a chunk of that many rows stays on the host."""
    floor, _ = shares
    assert f"[default: {STREAM_ROWS}]" in EXPERT_STREAM_ROWS_HELP
    e = Engine(
        q4_moe, max_context=CONTEXT, max_lanes=1, vram_budget=floor, expert_stream_rows=len(PROMPT)
    )
    assert e.expert_offload.stream.rows == len(PROMPT)
    e.expert_offload.counters.reset()
    spy = spy_on_host(e)
    e.runner.prefill(PROMPT, e.runner.new_state(CONTEXT), chunk=64, last_only=True)
    assert spy.rows and max(spy.rows) == len(PROMPT)
    assert e.expert_offload.counters.streamed_bytes == 0


def test_a_backend_with_a_second_stream_is_handed_the_next_layer(q4_moe, shares):
    """The GPU's prefetch hook: a backend offering ``prefetch_experts`` gets, as each layer
    streams, the next MoE layer's host experts, one group of weight names an expert (the CPU
    backend offers none)."""
    floor, experts = shares
    e = engine(q4_moe, floor + experts // 2)
    offload = e.expert_offload
    asked: list[set[str]] = []
    backend = offload.blocks[0].backend
    assert not hasattr(backend, "prefetch_experts")
    backend.prefetch_experts = lambda artifact, groups: asked.append(
        {frozenset(names) for names in groups}
    )
    try:
        e.runner.prefill(PROMPT, e.runner.new_state(CONTEXT), chunk=64, last_only=True)
    finally:
        del backend.prefetch_experts
    want = [
        {
            frozenset(f"text/layers/{b.layer}/moe/experts/{x}/{w}" for w in WEIGHTS)
            for x in b.host_experts
        }
        for b in offload.blocks[1:]
        if b.host_experts
    ]
    assert asked[-1] == set()  # the last layer hands over none: the backend lets go of the rest
    assert [a for a in asked if a] == want  # each layer but the last, before it computes


def test_a_backend_that_keeps_streamed_experts_prepares_them_its_way(q4_moe, shares, monkeypatch):
    """A backend offering ``keep_streamed`` and ``prepare_streamed`` (the CUDA backend's
    pinned copies) is told its allowance (every host expert's stored bytes, within
    ``pinned_allowance``) and prepares the window's experts through ``prepare_streamed``,
    a window's experts in one call."""
    from ninfer_runtime.expert_offload import stream_window as stream_module

    floor, experts = shares
    e = engine(q4_moe, floor + experts // 2)
    offload = e.expert_offload
    backend = offload.blocks[0].backend
    stored = sum(x.nbytes for b in offload.blocks for x in b.host_experts.values())
    told: list[int] = []
    backend.keep_streamed = told.append
    streamed: list[str] = []
    calls: list[int] = []

    def prepare_streamed(artifact, groups):
        calls.append(len(groups))
        streamed.extend(name for names in groups for name in names)
        return [backend.prepare(artifact, names) for names in groups]

    backend.prepare_streamed = prepare_streamed
    try:
        monkeypatch.setattr(stream_module, "pinned_allowance", lambda: stored + 1)
        offload.stream.keep_pinned(offload.blocks)
        monkeypatch.setattr(stream_module, "pinned_allowance", lambda: stored // 2)
        offload.stream.keep_pinned(offload.blocks)
        e.runner.prefill(PROMPT, e.runner.new_state(CONTEXT), chunk=64, last_only=True)
    finally:
        del backend.keep_streamed, backend.prepare_streamed
    assert stored > 0 and told == [stored, stored // 2]
    host = {
        f"text/layers/{b.layer}/moe/experts/{x}/{w}"
        for b in offload.blocks
        for x in b.host_experts
        for w in WEIGHTS
    }
    assert streamed and set(streamed) <= host
    assert len(streamed) == len(WEIGHTS) * sum(calls) and max(calls) > 1  # a window a call


def test_the_window_is_planned_as_device_memory(q4_moe, shares):
    from ninfer_runtime.expert_offload import ExpertOffload

    floor, experts = shares
    unplanned = ExpertOffload(floor + experts, calibrate=False)
    planned = ExpertOffload(floor + experts, calibrate=False, stream_window=experts // 2)
    assert planned.workspace == unplanned.workspace + experts // 2
    assert planned.stream.window_bytes == experts // 2 and unplanned.stream.window_bytes is None


@pytest.fixture(scope="module")
def glm5_next(tmp_path_factory):
    """Tiny GLM5Next (grouped sigmoid routing, scaled weights, a clamped SwiGLU expert) and its
    all-resident run."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests import tiny_glm5_next as tiny

    root = tmp_path_factory.mktemp("glm5_next_stream")
    tiny.convert("glm5_next_bf16", tiny.build_tiny_glm5_next(root / "ckpt"), root / "m.ninfer")
    path = root / "m.ninfer"
    floor, _ = budget_shares(path)
    runner = Engine(path, max_context=CONTEXT, max_lanes=1).runner
    return path, floor, prefill_then_greedy(runner, 64)


@pytest.mark.parametrize("window_experts", [None, 1])
def test_glm5_next_streams_with_its_own_routing_and_expert_math(glm5_next, window_experts):
    """The first part runs in GroupedMoe's own call; further parts use its ``expert_math``
    (the clamped SwiGLU) with the router's scaled weights."""
    path, floor, (tokens, logits) = glm5_next
    e = engine(path, floor)
    offload = e.expert_offload
    assert offload.plan.resident_fraction == 0
    if window_experts is not None:
        sizes = {offload.stream.expert_bytes(b, x) for b in offload.blocks for x in b.host_experts}
        offload.stream.window_bytes = max(sizes)
    offload.counters.reset()
    got_tokens, got = prefill_then_greedy(e.runner, 64)
    assert offload.counters.streamed_bytes > 0
    assert got_tokens == tokens
    np.testing.assert_allclose(got, logits, rtol=0, atol=1e-4)
    if window_experts is None:
        np.testing.assert_array_equal(got[0], logits[0])


class Prefetching(CpuBackend):
    """The CPU backend offering the next layer's prefetch, as a GPU backend does."""

    def prefetch_experts(self, artifact: Any, groups: Any) -> None:
        pass


def test_a_gpu_window_is_planned_twice_a_sixteenth_of_the_budget(q4_moe, shares):
    """A backend that prefetches (a GPU) holds two parts at once: given no window, each part
    is a sixteenth of the budget (within one layer's experts, at least the largest), and the
    plan holds both; a given window is planned once more for the prefetched part."""
    from ninfer_runtime.expert_offload import ExpertOffload

    artifact = Artifact.open(q4_moe)
    names = [n for n in artifact.bindings if n.startswith("text/")]
    sizes = WeightSizes.measure(artifact, names).experts
    layer = max(sum(per) for per in sizes.values())
    floor, experts = shares
    budget = floor + experts
    room = {}
    for backend in (CpuBackend(), Prefetching()):
        for window in (None, experts // 3):
            offload = ExpertOffload(budget, calibrate=False, host_cache=0, stream_window=window)
            try:
                offload.plan_load(SimpleNamespace(backend=backend), artifact, names)
            finally:
                offload.close()
            room[type(backend).__name__, window] = (offload.workspace, offload.stream.window_bytes)
    base = room["CpuBackend", None][0]
    assert room["CpuBackend", None][1] is None
    assert room["CpuBackend", experts // 3] == (base + experts // 3, experts // 3)
    window = default_window(sizes, budget)
    assert window == min(layer, max(budget // 16, max(max(per) for per in sizes.values())))
    assert room["Prefetching", None] == (base + 2 * window, window)
    assert room["Prefetching", experts // 3] == (base + 2 * (experts // 3), experts // 3)


def test_a_dense_model_plans_no_window(artifact_path):
    """No routed experts, nothing to stream: a prefetching backend plans no window room."""
    from ninfer_runtime.expert_offload import ExpertOffload

    artifact = Artifact.open(artifact_path("tiny_q4", "dense"))
    names = [n for n in artifact.bindings if n.startswith("text/")]
    offload = ExpertOffload(1 << 30, calibrate=False, host_cache=0)
    try:
        offload.plan_load(SimpleNamespace(backend=Prefetching()), artifact, names)
    finally:
        offload.close()
    assert offload.stream.window_bytes is None and offload.workspace == 0


@pytest.mark.parametrize("draft_tokens", [2, 3])
def test_mtp_rounds_keep_greedy_output_with_offload(q4_moe, draft_tokens):
    """Speculative rounds under a budget that keeps half the experts on the host: the
    verification's rows take the host path like decode's, and greedy output is plain
    decoding's under the same budget, with drafts both accepted and rejected."""
    from ninfer_runtime.engine import GenerationRequest
    from ninfer_runtime.frontend import SamplingParams
    from ninfer_runtime.speculative import SpecConfig
    from tests.runtime.test_engine_many_lanes import run_together

    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [[7, 300, 12, 45, 9, 101], [77, 3, 250, 18, 64, 5, 11, 2, 90]]
    requests = [GenerationRequest(prompt_ids=p, sampling=params) for p in prompts]

    def half_resident(**kw):
        """An engine of these settings with half its routed experts resident (its own
        context pool in the floor: drafts take pages of their own)."""
        plan = Engine(q4_moe, max_context=CONTEXT, max_lanes=2, vram_budget="1GiB", **kw)
        plan = plan.expert_offload.plan
        budget = plan.weights + plan.workspace + plan.context + plan.resident_bytes // 2
        return Engine(q4_moe, max_context=CONTEXT, max_lanes=2, vram_budget=budget, **kw)

    plain = half_resident()
    rounds = half_resident(spec=SpecConfig(draft_tokens=draft_tokens))
    assert rounds.expert_offload.plan.resident == plain.expert_offload.plan.resident
    assert 0 < rounds.expert_offload.plan.resident_fraction < 1
    rounds.expert_offload.counters.reset()
    assert run_together(rounds, requests)[0] == run_together(plain, requests)[0]
    stats = rounds.spec_stats
    assert stats.rounds > 0 and stats.drafted == stats.rounds * draft_tokens
    assert rounds.expert_offload.counters.host_total > 0  # verification on the host path


def test_decode_streams_on_a_gpu_where_the_host_has_no_kernel_for_its_experts(
    q4_moe, shares, reference
):
    """On a backend that prefetches (a GPU), a host expert without a host kernel (the CPU
    backend packs none: each is decoded at every use) is streamed in decode steps too: no pair is
    computed on the host, only the experts a step routes to cross, nothing is prefetched for
    a step, and the answers are the all-resident ones."""
    floor, experts = shares
    e = engine(q4_moe, floor + experts // 2)
    offload = e.expert_offload
    assert all(h.packed is None for b in offload.blocks for h in b.host_experts.values())
    backend = offload.blocks[0].backend
    asked: list[int] = []
    backend.prefetch_experts = lambda artifact, groups: asked.append(len(groups))
    spy = spy_on_host(e)
    after: list[tuple[int, int]] = []
    try:
        offload.counters.reset()
        tokens, logits = prefill_then_greedy(
            e.runner,
            64,
            lambda: after.append((len(asked), offload.counters.streamed_bytes)),
        )
    finally:
        del backend.prefetch_experts
    assert tokens == reference[0]
    np.testing.assert_allclose(logits, reference[1], rtol=0, atol=1e-4)
    # (a layer whose chosen experts are all resident still calls the host, with no pair)
    assert offload.counters.host_total == 0 and max(spy.rows, default=1) == 1
    assert offload.counters.device_total == (len(PROMPT) + STEPS) * TOP_K * LAYERS
    prefetches, prefill_bytes = after[0]
    assert prefetches > 0 and len(asked) == prefetches  # the prefill's, none from decode
    one_expert = max(
        offload.stream.expert_bytes(b, x) for b in offload.blocks for x in range(b.experts)
    )
    decode_bytes = offload.counters.streamed_bytes - prefill_bytes
    # each decode step routes one row to TOP_K experts a layer: at most those cross
    assert 0 < decode_bytes <= STEPS * LAYERS * TOP_K * one_expert


def test_which_decode_calls_spare_the_host():
    """``spares_host``: a call of few rows streams, on a backend that prefetches and with
    streaming on, where one of the host experts it routes to has no kernel (``auto``), where
    it routes to any (``all``), or never (``off``)."""
    from ninfer_runtime.cli_options import EXPERT_STREAM_DECODE, EXPERT_STREAM_DECODE_HELP
    from ninfer_runtime.errors import EngineError
    from ninfer_runtime.expert_offload.stream_window import STREAM_DECODE, ExpertStream

    assert EXPERT_STREAM_DECODE == STREAM_DECODE
    assert f"[default: {STREAM_DECODE[0]}]" in EXPERT_STREAM_DECODE_HELP
    kernel_less, packed = SimpleNamespace(packed=None), SimpleNamespace(packed=object())
    block = SimpleNamespace(backend=Prefetching(), host_experts={1: kernel_less, 2: packed})
    auto, every, never = (ExpertStream(decode=d) for d in ("auto", "all", "off"))
    assert auto.decode == "auto"
    assert auto.spares_host(block, np.array([[1, 0]]))
    assert auto.spares_host(block, np.array([[2, 0], [2, 1]]))
    assert not auto.spares_host(block, np.array([[2, 0]]))  # a kernel, or resident
    assert every.spares_host(block, np.array([[2, 0]]))
    assert not every.spares_host(block, np.array([[0, 3]]))  # all resident
    assert not never.spares_host(block, np.array([[1, 2]]))
    assert not ExpertStream(rows=None).spares_host(block, np.array([[1, 0]]))
    on_cpu = SimpleNamespace(backend=CpuBackend(), host_experts=block.host_experts)
    assert not every.spares_host(on_cpu, np.array([[1, 0]]))
    with pytest.raises(EngineError, match="expert_stream_decode is 'often'; expected one of"):
        ExpertStream(decode="often")


def test_decode_stays_on_the_host_when_told(q4_moe, shares):
    """``Engine(expert_stream_decode="off")``: decode computes its host pairs on the host
    even on a backend that prefetches, and the hottest keep decoded copies."""
    floor, _ = shares
    e = Engine(
        q4_moe, max_context=CONTEXT, max_lanes=1, vram_budget=floor, host_expert_cache="1GiB",
        expert_stream_decode="off",
    )  # fmt: skip
    offload = e.expert_offload
    assert offload.stream.decode == "off"
    backend = offload.blocks[0].backend
    backend.prefetch_experts = lambda artifact, groups: None
    try:
        offload.replan()
        held = [x.held is not None for b in offload.blocks for x in b.host_experts.values()]
        offload.counters.reset()
        spy = spy_on_host(e)
        greedy(e.runner, PROMPT[:8], 2)
    finally:
        del backend.prefetch_experts
    assert held and all(held)
    assert spy.rows.count(1) == 2 * LAYERS and offload.counters.host_total > 0  # each step


def test_no_decoded_copies_where_kernel_less_host_experts_stream(q4_moe, shares):
    """Decoded copies (``host_expert_cache``) spare the host's own way a decoding; where
    every call streams those experts instead (a GPU), the offload holds none."""
    floor, _ = shares
    e = engine(q4_moe, floor, host_cache="1GiB")
    offload = e.expert_offload
    experts = [x for b in offload.blocks for x in b.host_experts.values()]
    assert experts and all(x.held is not None for x in experts)
    backend = offload.blocks[0].backend
    backend.prefetch_experts = lambda artifact, groups: None
    try:
        offload.replan()
    finally:
        del backend.prefetch_experts
    assert not any(x.held is not None for b in offload.blocks for x in b.host_experts.values())
