"""The sizes an expert offload is planned with: the device budget (``--vram-budget``, else
``$NINFER_VRAM_BUDGET_MIB``), the host memory its decoded experts may take and that a GPU may
pin for streamed experts (the context pool's bytes beside the weights are
``PoolPlan.planned_bytes``)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..capacity import parse_size
from ..errors import EngineError

#: the budget in MiB when neither ``--vram-budget`` nor ``[engine] vram_budget`` gives one
VRAM_BUDGET_ENV = "NINFER_VRAM_BUDGET_MIB"
#: the share of the host's available memory the decoded copies of the hottest host experts
#: may take when ``host_expert_cache`` is not given
HOST_CACHE_SHARE = 0.25


def available_memory() -> int:
    """Bytes of host memory available now (physical pages free or reclaimable)."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def pinned_allowance() -> int:
    """Host bytes a GPU may keep streamed experts in (pinned, so each upload is a DMA): the
    same share of the memory available now as the decoded-expert cache's default."""
    return int(HOST_CACHE_SHARE * available_memory())


def host_cache_setting(given: str | int | None) -> int:
    """The decoded-expert allowance in bytes: ``given`` (a size; 0 turns it off), else a
    quarter of the host memory available now."""
    size = parse_size(given, "host expert cache")
    return int(HOST_CACHE_SHARE * available_memory()) if size is None else size


def vram_budget_setting(
    given: str | int | None, environ: Mapping[str, str] = os.environ
) -> int | None:
    """The budget in bytes: ``given`` (a size such as ``8GiB``, ``512MiB``), else
    ``$NINFER_VRAM_BUDGET_MIB`` (a number of MiB); None: no budget, every expert resident."""
    if given is not None:
        return parse_size(given, "vram budget")
    value = environ.get(VRAM_BUDGET_ENV, "").strip()
    if not value:
        return None
    try:
        mib = float(value)
    except ValueError:
        raise EngineError(f"${VRAM_BUDGET_ENV} {value!r}: expected a number of MiB") from None
    if mib < 0:
        raise EngineError(f"${VRAM_BUDGET_ENV} {value!r} must not be negative")
    return int(mib * (1 << 20))
