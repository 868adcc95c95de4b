"""Expert offload's prefill chunk: where a ``--vram-budget`` leaves routed experts in host
memory, every host expert a prefill call routes to crosses to the device once a call, so the
engine's prefill calls take ``STREAM_CHUNK`` rows (``--expert-stream-chunk``) when its own
chunk is smaller, planned in the budget's workspace like its own chunk. Where every expert
is resident, nothing streams and the engine's chunk stays. The tiny Qwen3.5 MoE on the CPU
backend (its simulated device)."""

from __future__ import annotations

import numpy as np

from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.cli_options import EXPERT_STREAM_CHUNK_HELP
from ninfer_runtime.engine import Engine, GenerationRequest, TokenEvent
from ninfer_runtime.expert_offload import load_plan
from ninfer_runtime.expert_offload.stream_window import STREAM_CHUNK
from ninfer_runtime.frontend import SamplingParams
from tests.runtime.offload_runs import CONTEXT

PROMPT = [int(t) for t in np.random.default_rng(11).integers(0, 300, 40)]


def make(path, budget, **options) -> Engine:
    return Engine(path, max_context=CONTEXT, max_lanes=1, vram_budget=budget, **options)


def test_host_experts_that_stream_take_the_stream_chunk(q4_moe, shares):
    floor, _ = shares
    assert f"[default: {STREAM_CHUNK}]" in EXPERT_STREAM_CHUNK_HELP
    e = make(q4_moe, floor)
    assert e.expert_offload.plan.resident_fraction == 0
    assert e.expert_offload.prefill_rows == STREAM_CHUNK
    assert e.prefill_chunk == e.scheduler.prefill_chunk == STREAM_CHUNK


def test_the_stream_chunk_is_an_engine_option_and_never_shortens_the_chunk(q4_moe, shares):
    floor, _ = shares
    assert make(q4_moe, floor, expert_stream_chunk=1000).prefill_chunk == 1000
    shorter = make(q4_moe, floor, prefill_chunk=96, expert_stream_chunk=64)
    assert shorter.prefill_chunk == shorter.expert_offload.prefill_rows == 96


def test_a_budget_that_holds_every_expert_keeps_the_engines_chunk(q4_moe):
    e = make(q4_moe, "1GiB", prefill_chunk=96)
    assert e.expert_offload.plan.resident_fraction == 1
    assert e.prefill_chunk == 96


def test_the_workspace_is_planned_for_the_stream_chunk(q4_moe, shares, monkeypatch):
    """The plan that leaves experts to stream is made again with the backend's workspace at
    the longer calls' rows, so the budget holds it."""
    floor, _ = shares
    asked: list[int] = []
    measured = load_plan.backend_workspace

    def spy(backend, artifact, rows):
        asked.append(rows)
        return measured(backend, artifact, rows)

    monkeypatch.setattr(load_plan, "backend_workspace", spy)
    make(q4_moe, floor, prefill_chunk=96)
    assert asked == [96, STREAM_CHUNK]


def test_the_longer_calls_give_the_same_tokens(q4_moe, shares):
    """Greedy output under the budget (one prefill call of the whole prompt) equals the
    all-resident engine's in calls of 8 rows."""
    floor, _ = shares

    def tokens(e: Engine) -> list[int]:
        sampling = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        request = GenerationRequest(prompt_ids=PROMPT, sampling=sampling, parse_output=False)
        return [ev.token_id for ev in e.generate(request) if isinstance(ev, TokenEvent)]

    streamed = make(q4_moe, floor)
    assert streamed.prefill_chunk > len(PROMPT)
    resident = Engine(q4_moe, max_context=CONTEXT, max_lanes=1, prefill_chunk=8)
    assert tokens(streamed) == tokens(resident)
    assert streamed.expert_offload.counters.streamed_bytes > 0


class RowsWorkspace(CpuBackend):
    """The CPU backend stating ``per_row`` bytes of device workspace a prefill row."""

    def __init__(self, per_row: int):
        self.per_row = per_row

    def device_workspace(self, config, rows: int, logit_rows: int) -> int:
        return self.per_row * rows


def test_a_budget_that_cannot_hold_the_longer_calls_keeps_the_engines_chunk(q4_moe, shares):
    """Room for 96 rows' workspace but not ``STREAM_CHUNK``'s: the engine's chunk and its
    plan stay, rather than a budget that works being refused."""
    floor, _ = shares
    per_row = 1024
    e = Engine(
        q4_moe,
        backend=RowsWorkspace(per_row),  # type: ignore[arg-type]
        max_context=CONTEXT,
        max_lanes=1,
        prefill_chunk=96,
        vram_budget=floor + 100 * per_row,
    )
    assert e.prefill_chunk == e.expert_offload.prefill_rows == 96
    assert e.expert_offload.plan.workspace == 96 * per_row
