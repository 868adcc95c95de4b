"""Shared by the expert offload tests on the CPU backend: greedy runs of a runner, engines
under a ``--vram-budget``, and a budget's shares."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from ninfer_runtime.engine import Engine
from ninfer_runtime.runner import ModelRunner

CONTEXT = 64


def greedy(
    runner: ModelRunner,
    prompt: np.ndarray,
    steps: int,
    chunk: int = 8,
    after_prefill: Callable[[], None] = lambda: None,
) -> tuple[list[int], np.ndarray]:
    """``prompt`` in chunks of ``chunk`` rows, then ``steps`` greedy steps: the tokens and
    every step's logits [steps + 1, V]."""
    state = runner.new_state(CONTEXT)
    logits = runner.prefill(prompt, state, chunk=chunk, last_only=True).logits[0][-1]
    after_prefill()
    out, seen = [], [logits]
    for _ in range(steps):
        out.append(int(np.argmax(logits)))
        logits = runner.forward([np.array([out[-1]])], [state]).logits[0][-1]
        seen.append(logits)
    return out, np.stack(seen)


def engine(path: Path | str, budget: int | str, host_cache: int | str | None = None) -> Engine:
    return Engine(
        path, max_context=CONTEXT, max_lanes=1, vram_budget=budget, host_expert_cache=host_cache
    )


def budget_shares(path: Path | str) -> tuple[int, int]:
    """The budget's floor (no routed expert resident) and the routed experts' bytes, from
    the plan under a budget that keeps them all."""
    plan = engine(path, "1GiB").expert_offload.plan
    assert plan.resident_fraction == 1
    return plan.weights + plan.workspace + plan.context, plan.resident_bytes
