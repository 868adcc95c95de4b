"""``ninfer-bench run --vram-budget``'s last offload line: the device memory the run held
against the plan (its workspace estimate among the plan's shares) and the most it had in
use at once, on a stand-in device."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np

from ninfer_runtime.bench.offload_rates import OffloadReport
from ninfer_runtime.expert_offload.plan import OffloadPlan

GIB = 2**30


class _Pool:
    """A pool's bytes in use and held, set by the test or by ``malloc``."""

    def __init__(self) -> None:
        self.used, self.held = 2 * GIB, 3 * GIB

    def malloc(self, size: int) -> int:
        self.used += size
        self.held = max(self.held, self.used)
        return size

    def used_bytes(self) -> int:
        return self.used

    def total_bytes(self) -> int:
        return self.held


class _Device:
    """An ``xp`` with a memory pool and ``cuda.set_allocator``, as CuPy has."""

    def __init__(self) -> None:
        self.pool = _Pool()
        self.allocator = self.pool.malloc
        self.cuda = SimpleNamespace(set_allocator=self.set_allocator)

    def set_allocator(self, malloc) -> None:
        self.allocator = malloc

    def get_default_memory_pool(self) -> _Pool:
        return self.pool


def _plan() -> OffloadPlan:
    return OffloadPlan(
        budget=8 * GIB,
        weights=2 * GIB,
        workspace=GIB,
        context=GIB // 2,
        resident={0: (0, 1)},
        experts={0: 4},
        resident_bytes=3 * GIB,
        host_bytes=3 * GIB,
    )


def test_the_run_holds_what_the_plan_said_beside_the_plan(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # no torch allocator in this run
    device = _Device()
    report = OffloadReport(SimpleNamespace(plan=_plan()), 1.0, None, device)  # once loaded
    assert device.allocator != device.pool.malloc  # allocations are watched
    device.allocator(4 * GIB)  # 6 GiB in use at once
    device.pool.used, device.pool.held = 5 * GIB, 7 * GIB  # the run, after frees
    rows = report.finish()
    assert device.allocator == device.pool.malloc  # handed back
    assert rows == [
        {
            "kind": "offload memory",
            "cupy_pool_bytes": 7 * GIB,
            "cupy_in_use_bytes": 5 * GIB,
            "cupy_peak_in_use_bytes": 6 * GIB,
            "loaded_pool_bytes": 3 * GIB,
            "loaded_in_use_bytes": 2 * GIB,
            "torch_reserved_bytes": 0,
            "planned_bytes": int(6.5 * GIB),
            "planned_workspace_bytes": GIB,
            "budget_bytes": 8 * GIB,
        }
    ]
    assert capsys.readouterr().out == (
        "device memory held: CuPy's pool 7.00 GiB at most (6.00 in use at most, 5.00 in use at "
        "the end; once loaded "
        "3.00, 2.00 in use), torch's allocator 0.00 GiB at most; the plan 6.50 GiB (weights "
        "2.00, workspace estimate 1.00, context pool 0.50, resident experts 3.00) of a 8.00 GiB "
        "budget\n"
    )


def test_no_watch_where_every_expert_is_resident(capsys, monkeypatch):
    """An offload that stepped aside runs as with no budget (its speed is compared with
    that): nothing is put between the pool and its callers, and the line says no peak."""
    monkeypatch.setitem(sys.modules, "torch", None)
    device = _Device()
    report = OffloadReport(SimpleNamespace(plan=_plan(), aside=True), 1.0, None, device)
    assert device.allocator == device.pool.malloc
    assert report.finish()[0]["cupy_peak_in_use_bytes"] is None
    assert "GiB at most (2.00 in use at the end;" in capsys.readouterr().out


def test_nothing_without_an_offload_or_on_the_host():
    assert OffloadReport(None, 0.0, None).finish() == []
    on_host = OffloadReport(SimpleNamespace(plan=_plan()), 1.0, None, np)
    assert on_host.finish() == []
