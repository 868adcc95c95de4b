"""The split's host pairs as a host node of the device's stream (``SplitMoe.node``), checked on
the CPU backend given a node that runs its function at once: a backend with host nodes keeps
capturing decode steps under a budget, every block queues its host pairs through the node, the
answers equal the split's without nodes to the bit, the rows' copies reach the function as
the device held them, and a placement tells the backend its captured steps are stale. Tiny
Qwen3.5 MoE (the GPU's own run: tests/gpu/test_expert_offload_graphs.py)."""

from __future__ import annotations

import numpy as np

from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.engine import Engine
from tests.runtime.offload_runs import CONTEXT, greedy

PROMPT = np.array([7, 300, 12, 45, 9, 101, 77, 3], dtype=np.int64)


class Nodes(CpuBackend):
    """The CPU backend with host nodes that run at once, a capturing flag and a count of
    ``forget_graphs`` calls."""

    def __init__(self) -> None:
        super().__init__()
        self.graphs = self.host_nodes = True
        self.calls: list[tuple[tuple[int, ...], ...]] = []
        self.forgotten = 0

    def host_node(self, fn, output_shape):
        def node(*inputs):
            self.calls.append(tuple(a.shape for a in inputs))
            copies = [np.array(a) for a in inputs]  # what a device's copies hand over
            out = fn(*copies)
            return (
                np.zeros(output_shape(*(a.shape for a in inputs)), np.float32)
                if out is None
                else out
            )

        return node

    def forget_graphs(self) -> None:
        self.forgotten += 1


def test_host_nodes_keep_steps_capturable_and_answer_alike(q4_moe, shares):
    floor, experts = shares
    budget = floor + experts // 2
    backend = Nodes()
    e = Engine(q4_moe, backend=backend, max_context=CONTEXT, max_lanes=1, vram_budget=budget)
    offload = e.expert_offload
    assert backend.graphs is True and not offload.aside and len(offload.blocks) == 4
    assert all(b.node_ready for b in offload.blocks)
    plain = Engine(q4_moe, max_context=CONTEXT, max_lanes=1, vram_budget=budget)
    want = greedy(plain.runner, PROMPT, 6)
    got = greedy(e.runner, PROMPT, 6)
    assert got[0] == want[0]
    np.testing.assert_array_equal(got[1], want[1])
    # each block once a call: the prompt's one chunk of 8 rows, then 6 decode rows of 1, each
    # call the rows [n, H], their experts [n, k] and their weights [n, k]
    blocks, k = len(offload.blocks), 2
    assert [c[0][0] for c in backend.calls] == [8] * blocks + [1] * 6 * blocks
    assert all(top == weights == (x[0], k) for x, top, weights in backend.calls)
    assert offload.counters.host_total > 0 and offload.counters.streamed_bytes == 0

    forgotten = backend.forgotten
    offload.replan({b.layer: np.where(b.resident, 0, 1) for b in offload.blocks})
    assert backend.forgotten == forgotten + len(offload.blocks)
    assert all(b.node_ready for b in offload.blocks) and backend.graphs is True
