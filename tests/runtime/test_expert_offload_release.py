"""What expert offload asks of a backend beyond the CPU's, checked on the CPU backend with the
CUDA backend's hooks recorded: every routed expert is prepared in a call of its own (on CUDA a
row window of its own), and every expert prepared after load that leaves the device (a
streamed window's, or one a new placement sends back to host memory) is handed to the
backend's ``release``, none that is still resident; a backend capturing decode steps as CUDA
graphs is refused in one line before any weight is prepared. Tiny Qwen3.5 MoE."""

from __future__ import annotations

import numpy as np

from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.engine import Engine
from ninfer_runtime.expert_offload.plan import routed_expert
from ninfer_runtime.expert_offload.split_moe import expert_names
from ninfer_runtime.expert_offload.stream_window import STREAM_ROWS
from tests.runtime.offload_runs import CONTEXT


class Recording(CpuBackend):
    """The CPU backend, keeping what it prepared (by call) and what it was asked to release."""

    def __init__(self, graphs: bool = False) -> None:
        super().__init__()
        self.graphs = graphs
        self.calls: list[list[str]] = []
        self.prepared: list[dict] = []
        self.released: list[list] = []

    def prepare(self, artifact, names):
        names = list(names)
        self.calls.append(names)
        out = super().prepare(artifact, names)
        self.prepared.append(out)
        return out

    def release(self, weights) -> None:
        self.released.append(list(weights))


def test_experts_are_prepared_alone_and_released_when_they_leave(q4_moe, shares):
    floor, experts = shares
    backend = Recording()
    e = Engine(
        q4_moe, backend=backend, max_context=CONTEXT, max_lanes=1, vram_budget=floor + experts // 2
    )
    offload = e.expert_offload
    state = e.runner.new_state(CONTEXT)
    prompt = np.random.default_rng(5).integers(0, 300, STREAM_ROWS + 8).astype(np.int64)
    offload.counters.reset()
    e.runner.prefill(prompt, state, chunk=len(prompt), last_only=True)
    assert offload.counters.streamed_bytes > 0  # a window was streamed (and released)
    before = dict(offload.plan.resident)
    flipped = {b.layer: np.where(b.resident, 0, 1) for b in offload.blocks}  # the host's first
    moved = offload.replan(flipped)
    assert all(set(moved.resident[layer]).isdisjoint(before[layer]) for layer in before)

    expert_calls = [call for call in backend.calls if any(map(routed_expert, call))]
    for call in expert_calls:  # one expert a call: gate, up and down
        layer, expert = routed_expert(call[0])
        assert sorted(call) == sorted(expert_names(layer, expert))
    weights = [w for out in backend.prepared for n, w in out.items() if routed_expert(n)]
    released = {id(w) for batch in backend.released for w in batch}
    live = {id(w) for b in offload.blocks for ws in b.device.values() for w in ws.values()}
    assert not released & live
    assert {id(w) for w in weights} == released | live
    for block in offload.blocks:  # the device experts are the planned ones, each prepared
        assert sorted(block.device) == list(moved.resident.get(block.layer, ()))


def test_a_backend_capturing_graphs_decodes_eagerly_with_offload(q4_moe):
    """The split reads each block's routing on the host: a capturing backend stops capturing
    before the model prepares anything, and the engine serves."""
    backend = Recording(graphs=True)
    engine = Engine(q4_moe, backend=backend, max_context=CONTEXT, max_lanes=1, vram_budget="1GiB")
    assert backend.graphs is False and engine.expert_offload is not None
