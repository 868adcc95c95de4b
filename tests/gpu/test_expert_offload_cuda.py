"""Expert offload on the CUDA backend (``--vram-budget``; graphs off, as offload runs without
host nodes: test_expert_offload_graphs.py has them): the
tiny Qwen3.5 MoE model with none, half or all of its routed experts resident on the device
gives the all-resident CUDA engine's greedy tokens, and its logits within ``LOGIT_TOL``; a
prompt chunk above ``STREAM_ROWS`` streams its host experts through the device, in one part or
one expert a part, to the same; the prefix cache and preemption keep working with offload on.

What the device holds is checked too: the resident experts are row windows of their own
(``Residency.cuts``), exactly those the split's experts use once calibration's and the tests'
streamed windows have been released, and the expert tables do not outlive the blocks'
replaced weights. All-resident engines upload whole banks, as without offload.

Engines run with float32 prefill products, so the two engines' routers choose alike (the split
routes with the moe family's ``route`` on ``backend.linear``'s logits, the device block with
its own kernel on its own product), and run decode steps eagerly, as the split does (it reads
each block's routing on the host); with graphs on, a budget that holds every expert beside
them makes the offload step aside instead, which the graphs' own test checks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.engine import (
    SHORT_CHUNK_TOKENS,
    Engine,
    Finished,
    GenerationRequest,
    TokenEvent,
)
from ninfer_runtime.errors import EngineError
from ninfer_runtime.expert_offload import NOT_SERVED
from ninfer_runtime.expert_offload import offload as offload_module
from ninfer_runtime.expert_offload.stream_window import STREAM_ROWS
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.ops import registry
from ninfer_runtime.ops.moe.reference import TOLERANCE
from ninfer_runtime.runner import ModelRunner

from .conftest import REPORT, requires_gpu

pytestmark = requires_gpu

PROMPT = np.array([7, 300, 12, 45, 9, 101, 77, 3, 250, 18, 64, 5], dtype=np.int64)
#: a prompt prefilled in one chunk of more rows than the stream threshold and than the
#: MoE's capturable device path (``MOE_DEVICE_ROWS``, 64): the grouped prefill takes it
LONG = np.random.default_rng(3).integers(0, 300, STREAM_ROWS + 48).astype(np.int64)
CONTEXT, STEPS = 160, 8
LAYERS, EXPERTS, TOP_K = 4, 4, 2  # the tiny Qwen3.5 MoE model
RECIPES = {"tiny_q4": "tiny_q4", "bf16": "qwen3_5_moe_bf16"}
#: the split's logits against the all-resident CUDA engine's, as a fraction of
#: max(1, max|logit|): the host's pairs are float32 products in another order than the
#: device's (test_backend.py's CPU-against-GPU bound at float32 products)
LOGIT_TOL = 2e-3


def host(a: Any) -> np.ndarray:
    import cupy as cp

    return cp.asnumpy(a) if isinstance(a, cp.ndarray) else np.asarray(a)


@pytest.fixture(scope="module", autouse=True)
def offload_on_cuda():
    """Prefill products in float32, the host's expert products on the float32 reference
    (beside a GPU the policy's first is ``torch_int4``, bf16 rows: its own test, at its
    stated tolerance), and decode steps eager: with graphs on, a budget that holds every
    expert beside them makes the offload step aside, and the plans' floors here are those
    of the split (the graphs' own test turns them on)."""
    with (
        pytest.MonkeyPatch.context() as mp,
        registry.override("moe", "host_products", "reference"),
    ):
        mp.setenv("NINFER_CUDA_PREFILL", "float32")
        mp.setenv("NINFER_CUDA_DECODE", "split")
        mp.setenv("NINFER_CUDA_GRAPHS", "0")
        yield


def engine(path: Path, budget: Any = None, **kw: Any) -> Engine:
    kw = {"max_context": CONTEXT, "max_lanes": 1, **kw}
    return Engine(path, backend="cuda", vram_budget=budget, **kw)


def shares(path: Path, **kw: Any) -> tuple[int, int]:
    """The budget's floor (no routed expert resident) and the routed experts' bytes, for an
    engine of these settings (its context pool is in the floor)."""
    plan = engine(path, "64GiB", **kw).expert_offload.plan
    assert plan.resident_fraction == 1
    return plan.weights + plan.workspace + plan.context, plan.resident_bytes


def run(runner: ModelRunner, prompt: np.ndarray, chunk: int, after_prefill=lambda: None):
    """``prompt`` in chunks of ``chunk`` rows, then ``STEPS`` greedy steps: the tokens and
    every step's logits [STEPS + 1, V] (host copies)."""
    state = runner.new_state(CONTEXT)
    logits = host(runner.prefill(prompt, state, chunk=chunk, last_only=True).logits[0])[-1]
    after_prefill()
    out, seen = [], [logits]
    for _ in range(STEPS):
        out.append(int(np.argmax(logits)))
        logits = host(runner.forward([np.array([out[-1]])], [state]).logits[0])[-1]
        seen.append(logits)
    return out, np.stack(seen)


def compare(case: str, reference: tuple, got: tuple, tol: float = LOGIT_TOL) -> None:
    """The same greedy tokens and logits within ``tol``; a step where the reference's top
    two are within the bound of each other is a tie (the sequences may part there, and
    comparing stops after it)."""
    (want_tokens, want), (tokens, logits) = reference, got
    scale = max(1.0, float(np.abs(want).max()))
    steps = len(want)
    for i, (a, b) in enumerate(zip(want_tokens, tokens, strict=True)):
        if a != b:
            gap = float(want[i][a] - want[i][b])
            assert gap < tol * scale, f"step {i}: {a} against {b}, reference gap {gap:.2e}"
            steps = i + 1
            break
    err = float(np.max(np.abs(want[:steps].astype(np.float64) - logits[:steps])))
    REPORT.append((case, "logits max|Δ| (rel to max|logit|)", f"{err:.2e} ({err / scale:.1e})"))
    REPORT.append((case, "identical greedy steps", f"{steps} of {len(want)}"))
    assert err < tol * scale, err


def device_holds_the_split_experts_only(e: Engine) -> None:
    """The residency's row windows are exactly the device experts' (streamed ones released),
    and no expert table outlives the weights it was built for."""
    backend = e.runner.model.backend
    residency = backend.residency
    used = {
        id(seg.parent)
        for block in e.expert_offload.blocks
        for weights in block.device.values()
        for w in weights.values()
        for seg in w.segments
    }
    assert {id(residency.parents[key]) for key in residency.cuts} == used
    assert len(backend.expert_tables) <= LAYERS + 1  # (the MTP block's MoE)


@pytest.fixture(scope="module")
def artifacts(gpu_artifact: Callable[[str, str], Path]) -> dict[str, Path]:
    return {name: gpu_artifact(recipe, "moe") for name, recipe in RECIPES.items()}


@pytest.fixture(scope="module")
def references(artifacts: dict[str, Path]) -> dict[str, dict[str, tuple]]:
    """The all-resident CUDA engine's runs (no budget: whole banks, no window)."""
    out = {}
    for name, path in artifacts.items():
        e = engine(path)
        assert e.expert_offload is None and e.runner.model.backend.residency.cuts == set()
        out[name] = {"short": run(e.runner, PROMPT, 8), "long": run(e.runner, LONG, len(LONG))}
    return out


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_residency_leaves_greedy_tokens_and_logits(artifacts, references, recipe, fraction):
    path = artifacts[recipe]
    floor, experts = shares(path)
    # decode steps on the host path too (``auto`` would stream these unpacked experts)
    e = engine(path, floor + int(fraction * experts), expert_stream_decode="off")
    offload = e.expert_offload
    assert offload.plan.resident_fraction == fraction
    offload.counters.reset()
    got = run(e.runner, PROMPT, 8)  # chunks of 8 rows: the host path, no stream
    compare(f"offload/{recipe}-{fraction:.0%} resident", references[recipe]["short"], got)
    counters = offload.counters
    assert (counters.device_total > 0) == (fraction > 0)
    assert (counters.host_total > 0) == (fraction < 1)
    assert counters.device_total + counters.host_total == (len(PROMPT) + STEPS) * TOP_K * LAYERS
    assert counters.streamed_bytes == 0
    device_holds_the_split_experts_only(e)


@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_host_experts_on_the_int4_kernel(artifacts, references, fraction):
    """The policy's default beside a GPU: every host expert packed for torch's CPU int4
    kernel (bf16 rows), the host's bytes counted, the all-resident engine's logits within the
    provider's stated tolerance and its greedy tokens up to a tie at that bound."""
    path = artifacts["tiny_q4"]
    floor, experts = shares(path)
    with registry.override("moe", "host_products", "torch_int4"):
        e = engine(path, floor + int(fraction * experts), expert_stream_decode="off")
    offload = e.expert_offload
    packed = [x.packed is not None for b in offload.blocks for x in b.host_experts.values()]
    assert len(packed) == int((1 - fraction) * LAYERS * EXPERTS) and all(packed)
    offload.counters.reset()
    got = run(e.runner, PROMPT, 8)
    tol = TOLERANCE["torch_int4"][1]
    compare(f"offload/int4-{fraction:.0%} resident", references["tiny_q4"]["short"], got, tol)
    assert offload.counters.host_total > 0 and offload.counters.host_bytes > 0


@pytest.mark.parametrize("window_experts", [None, 1])
@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_a_long_chunk_streams_its_host_experts(artifacts, references, fraction, window_experts):
    path = artifacts["tiny_q4"]
    floor, experts = shares(path)
    e = engine(path, floor + int(fraction * experts), expert_stream_decode="off")
    offload = e.expert_offload
    if window_experts is not None:  # parts of this many experts: the later parts' pairs
        offload.stream.window_bytes = window_experts * experts // (LAYERS * EXPERTS)
    offload.counters.reset()

    def after_prefill() -> None:
        counters = offload.counters
        assert counters.host_total == 0 and counters.streamed_bytes > 0
        assert counters.device_total == len(LONG) * TOP_K * LAYERS
        device_holds_the_split_experts_only(e)  # the window's experts are released

    got = run(e.runner, LONG, len(LONG), after_prefill)
    case = f"offload/stream-{fraction:.0%} resident-{window_experts or 'whole'} window"
    compare(case, references["tiny_q4"]["long"], got)
    assert offload.counters.host_total > 0  # decode's rows on the host path


def test_decode_streams_every_host_expert_when_told(artifacts, references):
    """``expert_stream_decode`` ``all``: every host expert a decode step routes to streams:
    no pair is computed on the host, and the tokens and logits are the all-resident
    engine's. (``auto``, the default, reads them in place on a GPU:
    test_expert_offload_mapped.py.)"""
    path = artifacts["tiny_q4"]
    floor, experts = shares(path)
    e = engine(path, floor + experts // 2, expert_stream_decode="all")
    offload = e.expert_offload
    offload.counters.reset()
    got = run(e.runner, PROMPT, 8)
    compare("offload/decode streamed (all)", references["tiny_q4"]["short"], got)
    counters = offload.counters
    assert counters.host_total == 0 and counters.streamed_bytes > 0
    assert counters.device_total == (len(PROMPT) + STEPS) * TOP_K * LAYERS
    device_holds_the_split_experts_only(e)


def test_a_replan_moves_experts_and_releases_those_that_leave(artifacts, references):
    path = artifacts["tiny_q4"]
    floor, experts = shares(path)
    e = engine(path, floor + experts // 2)
    offload = e.expert_offload
    before = dict(offload.plan.resident)
    moved = offload.replan({b.layer: np.where(b.resident, 0, 1) for b in offload.blocks})
    assert all(set(moved.resident[layer]).isdisjoint(before[layer]) for layer in before)
    device_holds_the_split_experts_only(e)
    compare("offload/replanned", references["tiny_q4"]["short"], run(e.runner, PROMPT, 8))


def answers(e: Engine, prompts: list[list[int]], tokens: int) -> list[tuple[list[int], int]]:
    out = []
    for prompt in prompts:
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        ids, cached = [], None
        for event in e.generate(GenerationRequest(prompt_ids=prompt, sampling=params)):
            if isinstance(event, TokenEvent):
                ids.append(event.token_id)
            elif isinstance(event, Finished):
                cached = event.usage.cached_tokens
        out.append((ids, cached))
    return out


def test_the_prefix_cache_with_offload(artifacts):
    """Answers with the cache equal cold answers, half the experts resident; the later
    prompts resume from the cache (after the shared history, the repeated ones at their
    end)."""
    path = artifacts["tiny_q4"]
    rng = np.random.default_rng(7)
    shared = rng.integers(0, 300, 96).tolist()
    prompts = [shared + rng.integers(0, 300, 5 + i).tolist() for i in range(3)] * 2
    # two lanes: the pool's snapshots then hold every prompt's checkpoints (one lane's four
    # would give the repeated first prompt's up to the later prompts')
    kw = {"max_context": 512, "max_lanes": 2, "checkpoint_interval": 32}
    half = {}  # each engine's budget for half the experts (the cache's pool is larger)
    for cache in (False, True):
        floor, experts = shares(path, prefix_cache=cache, **kw)
        half[cache] = floor + experts // 2
    cold = engine(path, half[False], **kw)
    warm = engine(path, half[True], prefix_cache=True, **kw)
    assert warm.expert_offload.plan.resident == cold.expert_offload.plan.resident
    cold_answers, warm_answers = answers(cold, prompts, 24), answers(warm, prompts, 24)
    assert [ids for ids, _ in warm_answers] == [ids for ids, _ in cold_answers]
    cached = [c for _, c in warm_answers]
    assert cached[0] == 0 and all(c >= len(shared) for c in cached[1:])


@pytest.mark.parametrize("host_capacity", ["0", "1GiB"])
def test_a_small_pool_preempts_and_resumes_with_offload(artifacts, host_capacity):
    """Four lanes in a pool of five pages: lanes are preempted and replayed (or copied to
    host memory and back) with half the experts resident, and every greedy stream equals an
    unconstrained run's with the same budget share."""
    from ninfer_runtime.state import PAGE_TOKENS, ContextPool

    path = artifacts["tiny_q4"]
    kw = {"max_lanes": 4, "max_context": 1024}
    roomy_floor, experts = shares(path, **kw)
    roomy = engine(path, roomy_floor + experts // 2, **kw)
    specs, mtp = roomy.runner.specs, roomy.runner.mtp_spec
    lane = roomy.runner.new_pool(lanes=1, max_context=8, step_rows=SHORT_CHUNK_TOKENS)
    page = ContextPool.page_bytes_of(specs, mtp, PAGE_TOKENS, roomy.kv_dtype)
    capacity = 4 * lane.slot_bytes + 5 * page
    small_kw = {**kw, "context_capacity": capacity, "prefix_cache": True}
    small_floor, _ = shares(path, **small_kw)
    small = engine(
        path, small_floor + experts // 2, host_context_capacity=host_capacity, **small_kw
    )
    assert small.pool.pages == 5
    params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, 300, 6 + 3 * i).tolist() for i in range(4)]

    def streams(e: Engine) -> list[list[int]]:
        ids: dict[Any, list[int]] = {}
        for prompt in prompts:
            ids[e.submit(GenerationRequest(prompt_ids=prompt, sampling=params))] = []
        while e.has_work:
            for event in e.step():
                if isinstance(event, TokenEvent):
                    ids[event.request_id].append(event.token_id)
        return list(ids.values())

    assert streams(small) == streams(roomy)
    assert small.preemptions > 0
    assert (small.replayed_tokens > 0) == (host_capacity == "0")


def test_graphs_stay_where_every_expert_fits_and_turn_off_where_one_cannot(artifacts, monkeypatch):
    """With decode steps captured: a budget that holds every expert beside the graphs keeps
    them (the offload steps aside, no split); one at the floor turns them off for the split;
    a backend outside the served ones is refused in one line."""
    path = artifacts["tiny_q4"]
    monkeypatch.setenv("NINFER_CUDA_GRAPHS", "1")
    roomy = engine(path, "64GiB")
    assert roomy.runner.model.backend.graphs is True
    assert roomy.expert_offload.aside and roomy.expert_offload.blocks == []
    floor, _ = shares(path)  # (with the graphs' workspace: the aside plan's floor)
    # the host's products read the routing (auto reads the experts in place, captured:
    # test_expert_offload_mapped.py)
    tight = engine(path, floor, expert_stream_decode="off")
    assert tight.runner.model.backend.graphs is False and not tight.expert_offload.aside
    assert engine(path).runner.model.backend.graphs is True  # no budget: captured
    monkeypatch.setattr(offload_module, "OFFLOAD_BACKENDS", ("cpu",))
    with pytest.raises(EngineError, match=NOT_SERVED) as exc:
        engine(path, "64GiB")
    assert "\n" not in str(exc.value)
