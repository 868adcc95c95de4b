"""Counts of where routed experts were computed, for ``/metrics`` and for the next plan.

Every (token, slot) pair a router chooses is one hit of its expert, on the device when the
expert is resident and on the host when it is not. The per-expert totals are also a
priority: a later load can keep the experts this run chose most (``plan_residency``'s
``counts``). The engine's steps write (on a GPU, the host's share of a step records from the
driver's callback thread while the engine thread waits for the step).

A block that reads its host experts in place (``mapped`` decode) has no routing on the host:
it adds its pairs to a device array (``on_device``, the moe family's ``hits``), one array for
every layer so ``drain`` reads them all back in one copy, which the totals, ``counts`` and
``reset`` do. So they are read on the engine's thread between steps (the server's readings
are, after every step); ``layer_counts`` is what a step may read inside itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..backends.base import to_numpy


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
        #: pair), counted on the device (``mapped_bytes``)
        self._mapped_bytes = 0
        #: the device's counts of every layer (``on_device``; None until a block asks), each
        #: layer's first row in it, and the bytes a pair of each of its experts reads over the
        #: link (0: resident) by layer
        self._pending: Any = None
        self._first = dict(zip(experts, np.cumsum([0, *experts.values()]).tolist(), strict=False))
        self._link_bytes: dict[int, np.ndarray] = {}

    def on_device(self, layer: int, xp: Any, link_bytes: np.ndarray) -> Any:
        """The device array [E] int32 ``layer``'s block adds the pairs it reads in place to,
        each pair of expert e reading ``link_bytes[e]`` stored bytes over the link (0 for a
        resident one); what it counted before (under other link bytes) is drained first. The
        same array each call (a captured step holds its address)."""
        self.drain()
        if self._pending is None:
            total = int(sum(len(h) for h in self.device_hits.values()))
            self._pending = xp.zeros(total, dtype=xp.int32)
        self._link_bytes[layer] = np.asarray(link_bytes, dtype=np.int64)
        first = self._first[layer]
        return self._pending[first : first + len(self.device_hits[layer])]

    def drain(self) -> None:
        """Move the device's counts (``on_device``) into the totals: its pairs are the
        device's hits, and read their experts' bytes over the link."""
        if self._pending is None:
            return
        got = np.array(to_numpy(self._pending), dtype=np.int64)
        if not got.any():
            return
        self._pending.fill(0)
        for layer, link in self._link_bytes.items():
            first = self._first[layer]
            hits = got[first : first + len(link)]
            self.device_hits[layer] += hits
            self._mapped_bytes += int(hits @ link)

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
        self.drain()
        return {layer: self.layer_counts(layer) for layer in self.host_hits}

    def layer_counts(self, layer: int) -> np.ndarray:
        """``layer``'s hits as last drained: a priority read inside a step, which must not
        wait for the device (``drain`` does)."""
        return self.device_hits[layer] + self.host_hits[layer]

    def totals(self) -> dict[str, float]:
        """The totals ``/metrics`` shows, by the server's counter names (the device's counts
        read back once)."""
        self.drain()
        return {
            "expert_device_hits": _total(self.device_hits),
            "expert_host_hits": self.host_total,
            "expert_host_wait_seconds": self.host_wait_seconds,
            "expert_streamed_bytes": self.streamed_bytes,
            "expert_host_bytes": self.host_bytes,
            "expert_mapped_bytes": self._mapped_bytes,
        }

    @property
    def device_total(self) -> int:
        self.drain()
        return _total(self.device_hits)

    @property
    def mapped_bytes(self) -> int:
        self.drain()
        return self._mapped_bytes

    @property
    def host_total(self) -> int:
        return _total(self.host_hits)

    def reset(self) -> None:
        self.drain()
        for hits in (*self.device_hits.values(), *self.host_hits.values()):
            hits[:] = 0
        self.host_wait_seconds = 0.0
        self.streamed_bytes = 0
        self.host_bytes = 0
        self._mapped_bytes = 0


def _total(hits: Mapping[int, np.ndarray]) -> int:
    """Every layer's hits summed."""
    return int(sum(int(h.sum()) for h in hits.values()))
