"""Counts of where routed experts were computed, for ``/metrics`` and for the next plan.

Every (token, slot) pair a router chooses is one hit of its expert, on the device when the
expert is resident and on the host when it is not. The per-expert totals are also a
priority: a later load can keep the experts this run chose most (``plan_residency``'s
``counts``). The engine's steps write (on a GPU, the host's share of a step records from the
driver's callback thread while the engine thread waits for the step); a reader on another
thread (a metrics scrape) reads plain numbers.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class ExpertCounters:
    def __init__(self, experts: Mapping[int, int]):
        """``experts``: layer -> its routed experts."""
        self.device_hits = {layer: np.zeros(n, dtype=np.int64) for layer, n in experts.items()}
        self.host_hits = {layer: np.zeros(n, dtype=np.int64) for layer, n in experts.items()}
        #: seconds the device side waited for the host's experts (on the CPU backend, whose
        #: "device" is the same CPU, the host share's whole time)
        self.host_wait_seconds = 0.0
        #: stored bytes of host experts streamed to the device for large token counts (the
        #: prefill window, ``stream_window``; on the CPU backend, what a GPU would copy)
        self.streamed_bytes = 0
        #: bytes of host experts the host read computing its pairs (each chosen expert's
        #: form in host memory, once a call)
        self.host_bytes = 0
        #: stored bytes the device read in place from host memory (``mapped`` decode, once a
        #: pair), counted only while a census runs (``SplitMoe.census``: the routing is then
        #: read back), so not among ``totals``
        self.mapped_bytes = 0

    def record(
        self,
        layer: int,
        top: np.ndarray,
        resident: np.ndarray,
        seconds: float,
        host_bytes: int = 0,
    ) -> None:
        """One block's routing: ``top`` [N, k] chosen experts; ``resident`` [E] bool; the
        host's time and the bytes it read for its share."""
        hits = np.bincount(top.reshape(-1), minlength=len(resident))
        self.device_hits[layer] += np.where(resident, hits, 0)
        self.host_hits[layer] += np.where(resident, 0, hits)
        self.host_wait_seconds += seconds
        self.host_bytes += host_bytes

    def counts(self) -> dict[int, np.ndarray]:
        """Per layer, each expert's hits wherever it ran: a residency priority."""
        return {layer: self.device_hits[layer] + self.host_hits[layer] for layer in self.host_hits}

    def totals(self) -> dict[str, float]:
        """The totals ``/metrics`` shows, by the server's counter names."""
        return {
            "expert_device_hits": self.device_total,
            "expert_host_hits": self.host_total,
            "expert_host_wait_seconds": self.host_wait_seconds,
            "expert_streamed_bytes": self.streamed_bytes,
            "expert_host_bytes": self.host_bytes,
        }

    @property
    def device_total(self) -> int:
        return int(sum(int(h.sum()) for h in self.device_hits.values()))

    @property
    def host_total(self) -> int:
        return int(sum(int(h.sum()) for h in self.host_hits.values()))

    def reset(self) -> None:
        for hits in (*self.device_hits.values(), *self.host_hits.values()):
            hits[:] = 0
        self.host_wait_seconds = 0.0
        self.streamed_bytes = 0
        self.host_bytes = 0
        self.mapped_bytes = 0
