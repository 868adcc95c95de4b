"""MoE expert offload: routed experts that do not fit a ``--vram-budget`` live in host memory
in their stored format and the CPU computes their share (``docs/runtime.md``, "MoE expert
offload"); prefill chunks, and on a GPU decode steps whose host experts the host has no
kernel for, stream them through the device instead (``stream_window``)."""

from .counters import ExpertCounters
from .offload import NOT_SERVED, OFFLOAD_BACKENDS, ExpertOffload
from .plan import OffloadPlan, VramBudgetError, WeightSizes, plan_residency
from .settings import VRAM_BUDGET_ENV, host_cache_setting, vram_budget_setting
from .split_moe import HOST_ROUTING
from .stream_window import STREAM_ROWS, ExpertStream

__all__ = [
    "HOST_ROUTING",
    "NOT_SERVED",
    "OFFLOAD_BACKENDS",
    "STREAM_ROWS",
    "VRAM_BUDGET_ENV",
    "ExpertCounters",
    "ExpertOffload",
    "ExpertStream",
    "OffloadPlan",
    "VramBudgetError",
    "WeightSizes",
    "host_cache_setting",
    "plan_residency",
    "vram_budget_setting",
]
