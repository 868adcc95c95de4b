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


def test_a_backend_capturing_graphs_decodes_eagerly_with_offload(q4_moe, shares):
    """The split reads each block's routing on the host: a capturing backend stops capturing
    before the model prepares anything, and the engine serves."""
    floor, experts = shares
    backend = Recording(graphs=True)
    engine = Engine(
        q4_moe, backend=backend, max_context=CONTEXT, max_lanes=1, vram_budget=floor + experts // 2
    )
    offload = engine.expert_offload
    assert backend.graphs is False and not offload.aside and len(offload.blocks) == 4
    first = next(i for i, call in enumerate(backend.calls) if any(map(routed_expert, call)))
    assert not any(map(routed_expert, backend.calls[0]))  # experts come after, one by one
    assert first > 0


def test_where_every_expert_fits_beside_the_graphs_the_offload_steps_aside(q4_moe):
    """A budget that holds every routed expert beside captured decode steps: the steps stay
    captured, nothing is split, every expert is prepared with the model (whole banks, as
    without a budget), and the answers are the plain engine's."""
    backend = Recording(graphs=True)
    e = Engine(q4_moe, backend=backend, max_context=CONTEXT, max_lanes=1, vram_budget="1GiB")
    offload = e.expert_offload
    assert backend.graphs is True and offload.aside and offload.blocks == []
    assert offload.plan.resident_fraction == 1
    assert offload.replan() is offload.plan  # nothing to place again
    prepared = [n for call in backend.calls for n in call if routed_expert(n)]
    assert prepared and all(
        len(call) > 3 for call in backend.calls if any(map(routed_expert, call))
    )
    plain = Engine(q4_moe, max_context=CONTEXT, max_lanes=1)
    prompt = np.array([7, 300, 12, 45, 9], dtype=np.int64)
    a, b = (x.runner.new_state(CONTEXT) for x in (e, plain))
    got = e.runner.prefill(prompt, a, chunk=8, last_only=True).logits[0]
    want = plain.runner.prefill(prompt, b, chunk=8, last_only=True).logits[0]
    np.testing.assert_array_equal(got, want)
