"""Expert offload with decode steps captured as CUDA graphs: where every host expert has the
host's int4 kernel, a split block queues its host pairs as a host node of the step
(``SplitMoe.node``), so the steps stay captured under a budget. The tiny Qwen3.5 MoE model
with some of its routed experts in host memory decodes, captured, the greedy tokens of the
same engine's steps run eagerly (the same host nodes, queued as the step issues) and
logits within the int4 host kernel's stated tolerance of the all-resident engine's; a replan
between steps makes the captured steps run once eagerly and capture again, and they still
give the eager steps' tokens."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.engine import Engine
from ninfer_runtime.ops import registry
from ninfer_runtime.ops.moe.reference import TOLERANCE

from .conftest import REPORT, requires_gpu

pytestmark = requires_gpu

PROMPT = np.array([7, 300, 12, 45, 9, 101, 77, 3, 250, 18, 64, 5], dtype=np.int64)
CONTEXT, STEPS = 160, 8


def host(a: Any) -> np.ndarray:
    import cupy as cp

    return cp.asnumpy(a) if isinstance(a, cp.ndarray) else np.asarray(a)


def engine(path: Path, graphs: bool, budget: Any = None) -> Engine:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NINFER_CUDA_PREFILL", "float32")
        mp.setenv("NINFER_CUDA_GRAPHS", "1" if graphs else "0")
        mp.setenv("NINFER_CUDA_HOST_NODES", "1")
        return Engine(
            path, backend="cuda", vram_budget=budget, max_context=CONTEXT, max_lanes=1,
            expert_stream_decode="off",  # the host's products (auto reads them in place)
        )  # fmt: skip


def decode(e: Engine, steps: int = STEPS) -> tuple[list[int], np.ndarray]:
    """``PROMPT`` prefilled, then ``steps`` greedy steps: the tokens and every logits row."""
    runner = e.runner
    state = runner.new_state(CONTEXT)
    logits = host(runner.prefill(PROMPT, state, chunk=8, last_only=True).logits[0])[-1]
    out, seen = [], [logits]
    for _ in range(steps):
        out.append(int(np.argmax(logits)))
        logits = host(runner.forward([np.array([out[-1]])], [state]).logits[0])[-1]
        seen.append(logits)
    return out, np.stack(seen)


def captured(e: Engine) -> list[Any]:
    """The runner's decode steps that hold a captured graph."""
    return [s for s in e.runner.steps._steps.values() if getattr(s, "graph", None) is not None]


@pytest.fixture(scope="module")
def tiny(gpu_artifact: Callable[[str, str], Path]) -> Path:
    return gpu_artifact("tiny_q4", "moe")


@pytest.fixture(scope="module", autouse=True)
def int4_host_products():
    with registry.override("moe", "host_products", "torch_int4"):
        yield


def split_budget(path: Path) -> int:
    """A budget a byte short of every routed expert beside captured steps (the split's plan
    takes the prefill window's room from it too, so some experts stay in host memory)."""
    plan = engine(path, True, "64GiB").expert_offload.plan
    assert plan.resident_fraction == 1
    return plan.weights + plan.workspace + plan.context + plan.resident_bytes - 1


def eagerly(e: Engine) -> tuple[list[int], np.ndarray]:
    """``decode`` with the engine's steps run eagerly (the same plan and experts)."""
    backend = e.runner.model.backend
    backend.graphs = False  # captured steps see no epoch and run eagerly
    try:
        return decode(e)
    finally:
        backend.graphs = True


def test_captured_steps_with_host_experts(tiny):
    split = engine(tiny, True, split_budget(tiny))
    offload = split.expert_offload
    assert not offload.aside and offload.blocks and offload.plan.resident_fraction < 1
    REPORT.append(("offload/graphs", "resident", f"{offload.plan.resident_fraction:.0%}"))
    assert all(b.node_ready for b in offload.blocks)
    assert split.runner.model.backend.graphs is True
    tokens, logits = decode(split)
    assert captured(split), "no decode step was captured"
    assert offload.counters.host_total > 0

    eager_tokens, eager_logits = eagerly(split)
    _, resident_logits = decode(engine(tiny, True))
    scale = max(1.0, float(np.abs(resident_logits).max()))
    err = float(np.abs(logits - resident_logits).max())
    eager_err = float(np.abs(logits - eager_logits).max())
    REPORT.append(("offload/graphs", "logits max|Δ| against all resident", f"{err:.2e}"))
    REPORT.append(("offload/graphs", "logits max|Δ| against eager", f"{eager_err:.2e}"))
    assert tokens == eager_tokens
    assert err < TOLERANCE["torch_int4"][1] * scale
    assert eager_err < 1e-4 * scale


def test_a_replan_recaptures_the_steps(tiny):
    """The experts swapped between device and host after steps were captured: the next
    decode runs each step once eagerly, captures it again, and gives the tokens of the same
    engine's steps run eagerly."""
    e = engine(tiny, True, split_budget(tiny))
    decode(e)
    offload = e.expert_offload
    backend = e.runner.model.backend
    epoch = backend.graph_epoch
    offload.replan({b.layer: np.where(b.resident, 0, 1) for b in offload.blocks})
    assert backend.graph_epoch > epoch and all(b.node_ready for b in offload.blocks)
    tokens, logits = decode(e)
    assert captured(e)
    eager_tokens, eager_logits = eagerly(e)
    assert tokens == eager_tokens
    scale = max(1.0, float(np.abs(eager_logits).max()))
    assert float(np.abs(logits - eager_logits).max()) < 1e-4 * scale
