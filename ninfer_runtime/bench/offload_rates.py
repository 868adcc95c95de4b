"""What expert offload moves during ``ninfer-bench run --vram-budget``, beside its floors.

For each decode row and the prefill, the offload's counters over that measurement: the share
of routed (token, expert) pairs the host computed, the host experts' bytes it read a step
(floor: those bytes over the host's read bandwidth), the time the device waited for it a
step, and the expert bytes streamed to the device a step (floor: over the rate pinned host
memory copies to the device; none on the CPU backend, whose device is host memory). Both
rates are measured in the same run (``probes``). Warm-up steps count with the timed ones, so
a figure a step is over all of them. Where decode reads host experts in place (``mapped``),
the device counts its pairs (``ExpertCounters.on_device``), and the row says the bytes they
read over the link a step (one read a pair; floor: over the upload rate).

Once every measurement is done, ``finish`` sets the device memory the run held against the
plan: CuPy's pool (which keeps freed blocks, so its size is a high-water mark of the run's
use plus what its size classes could not reuse; the bench's probes give theirs back, so it
is the engine's), the most bytes in use at once where experts stay on the host
(``pool_peak.PeakInUse``, watched from load on; not where every expert is resident, whose
speed the run compares with no budget), the same once the model was loaded, and torch's
allocator's most reserved (its fused attention), beside the plan's weights, workspace
estimate, context pool and resident experts.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import Any

import click

from .pool_peak import PeakInUse
from .probes import host_read_bandwidth, upload_bandwidth


@dataclass(frozen=True)
class OffloadShare:
    label: str
    steps: int
    host_pairs: float  # share of the routed pairs computed on the host
    host_bytes: float  # a step
    host_wait_ms: float  # a step
    streamed_bytes: float  # a step
    host_floor_ms: float  # host_bytes over the host's read bandwidth
    upload_floor_ms: float | None  # streamed_bytes over the upload rate (None: no GPU)
    #: whether decode read host experts in place (``mapped``), the stored bytes it read so
    #: a step, and their floor over the upload rate (None: no GPU)
    mapped: bool = False
    mapped_bytes: float = 0.0
    mapped_floor_ms: float | None = None


def measured(
    label: str,
    counters: Any,
    steps: int,
    read_bw: float,
    upload_bw: float | None,
    mapped: bool = False,
) -> OffloadShare:
    """``counters`` (``ExpertCounters``) after ``steps`` steps since their reset
    (``mapped``: the device read host experts in place)."""
    pairs = counters.device_total + counters.host_total
    host_bytes = counters.host_bytes / steps
    streamed = counters.streamed_bytes / steps
    return OffloadShare(
        label,
        steps,
        counters.host_total / pairs if pairs else 0.0,
        host_bytes,
        1e3 * counters.host_wait_seconds / steps,
        streamed,
        1e3 * host_bytes / read_bw,
        1e3 * streamed / upload_bw if upload_bw else None,
        mapped,
        counters.mapped_bytes / steps,
        1e3 * counters.mapped_bytes / steps / upload_bw if upload_bw else None,
    )


def line(share: OffloadShare | dict[str, Any]) -> str:
    """One line for the terminal and the record (``share`` or its ``as_row``)."""
    r = share if isinstance(share, dict) else asdict(share)
    upload = f", floor {r['upload_floor_ms']:.3g} ms" if r["upload_floor_ms"] is not None else ""
    mapped = ""
    if r.get("mapped"):
        floor = r["mapped_floor_ms"]
        mapped = f"; read in place {r['mapped_bytes'] / 1e6:.3g} MB a step" + (
            f", floor {floor:.3g} ms" if floor is not None else ""
        )
    return (
        f"offload, {r['label']}: host pairs {r['host_pairs']:.0%}; host read "
        f"{r['host_bytes'] / 1e6:.3g} MB a step (floor {r['host_floor_ms']:.3g} ms), the "
        f"device waited {r['host_wait_ms']:.3g} ms; streamed "
        f"{r['streamed_bytes'] / 1e6:.3g} MB a step{upload}{mapped}"
    )


def as_row(share: OffloadShare) -> dict[str, Any]:
    return {"kind": "offload", **asdict(share)}


class OffloadReport:
    """The offload's counters read around each measurement of a run (nothing without one)."""

    def __init__(self, offload: Any, read_bw: float, upload_bw: float | None, xp: Any = None):
        self.offload, self.read_bw, self.upload_bw = offload, read_bw, upload_bw
        self.xp = xp
        #: the device pool's bytes in use and held once the model is loaded (None: no pool)
        self.loaded = _pool_bytes(xp)
        #: the most bytes in use from here on, where experts stay on the host
        self.peak = PeakInUse.install(xp) if _splits(offload) else None

    @classmethod
    def start(cls, offload: Any, xp: Any) -> OffloadReport:
        """The floors' rates measured now, and said (when there is an offload)."""
        if offload is None:
            return cls(None, 0.0, None)
        threads = offload.host.threads
        read_bw, upload_bw = host_read_bandwidth(threads), upload_bandwidth(xp)
        upload = f"; host-to-device copy {upload_bw / 1e9:.1f} GB/s" if upload_bw else ""
        click.echo(f"host read {read_bw / 1e9:.1f} GB/s on {threads} threads{upload}")
        return cls(offload, read_bw, upload_bw, xp)

    def finish(self) -> list[dict[str, Any]]:
        """The device memory the run held against the plan, said (nothing without an
        offload, or on the CPU backend, whose device is host memory)."""
        plan = self.offload.plan if self.offload is not None else None
        held = _pool_bytes(self.xp)
        if plan is None or held is None or self.loaded is None:
            return []
        (used, pool), (loaded_used, loaded_pool) = held, self.loaded
        peak = self.peak.stop() if self.peak is not None else None
        torch = sys.modules.get("torch")
        on_torch = torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
        reserved = int(torch.cuda.max_memory_reserved()) if on_torch else 0
        row = {
            "kind": "offload memory",
            "cupy_pool_bytes": pool,
            "cupy_in_use_bytes": used,
            "cupy_peak_in_use_bytes": peak,
            "loaded_pool_bytes": loaded_pool,
            "loaded_in_use_bytes": loaded_used,
            "torch_reserved_bytes": reserved,
            "planned_bytes": plan.weights + plan.workspace + plan.context + plan.resident_bytes,
            "planned_workspace_bytes": plan.workspace,
            "budget_bytes": plan.budget,
        }
        gib = 2**30
        most = f"{peak / gib:.2f} in use at most, " if peak is not None else ""
        click.echo(
            f"device memory held: CuPy's pool {pool / gib:.2f} GiB at most ({most}"
            f"{used / gib:.2f} in use at the end; once loaded {loaded_pool / gib:.2f}, "
            f"{loaded_used / gib:.2f} in use), torch's allocator {reserved / gib:.2f} GiB at "
            f"most; the plan {row['planned_bytes'] / gib:.2f} GiB "
            f"(weights {plan.weights / gib:.2f}, workspace estimate {plan.workspace / gib:.2f}, "
            f"context pool {plan.context / gib:.2f}, resident experts "
            f"{plan.resident_bytes / gib:.2f}) of a {plan.budget / gib:.2f} GiB budget"
        )
        return [row]

    def reset(self) -> None:
        if self.offload is not None:
            self.offload.counters.reset()

    def read(self, label: str, steps: int) -> list[dict[str, Any]]:
        """The rows of ``steps`` steps since ``reset``, each also said."""
        if self.offload is None:
            return []
        mapped = self._maps()
        share = measured(label, self.offload.counters, steps, self.read_bw, self.upload_bw, mapped)
        click.echo(line(share))
        return [as_row(share)]

    def _maps(self) -> bool:
        """Whether decode reads some block's host experts in place."""
        return self.offload is not None and any(b.maps for b in self.offload.blocks)


def _splits(offload: Any) -> bool:
    """Whether ``offload`` leaves experts on the host (not None, not stepped aside)."""
    return offload is not None and not getattr(offload, "aside", False)


def _pool_bytes(xp: Any) -> tuple[int, int] | None:
    """CuPy's default pool: bytes in use and bytes held (None for an array module without
    one, the CPU backend's numpy)."""
    if not hasattr(xp, "get_default_memory_pool"):
        return None
    pool = xp.get_default_memory_pool()
    return int(pool.used_bytes()), int(pool.total_bytes())
