"""The measuring half of ``ninfer-bench cache``: the prefix cache and a pool under pressure,
through the real ``Engine``.

**Cached prefix TTFT.** One lane with the prefix cache on: a request of ``prefix`` random
tokens and ``suffix`` more is timed from ``submit`` to its first token (cold), then requests of
the same prefix and fresh suffixes (cached: they resume from the checkpoint the first one
kept at the prefix boundary, ``checkpoint_interval = prefix``, and prefill only the suffix).
Each is shown beside its floor: the FLOPs of the tokens actually prefilled at the rate of a
measured matrix product (``costs.prefill_flops``, ``probes.matmul_rate``).

**Memory pressure.** ``requests`` requests of ``context`` tokens each (a random prompt, then
``max_tokens`` greedy tokens) submitted at once to an engine whose context capacity holds
only ``full_requests`` of them at full length beside the lanes' recurrent state (the
checkpoints' snapshots share those pages): every request must complete, through cache
eviction and preemption (replay, or with ``host_context_capacity`` a copy to host memory
and back), with the tokens of the same requests run unconstrained.

The package, one job a module: ``prefix`` (``prefix_ttft``), ``pressure``
(``memory_pressure``), ``tables`` (``table_lines``, ``markdown``) and ``requests`` (the
greedy, fixed-length requests both send).
"""

from __future__ import annotations

from .prefix import CacheMiss, PrefixResult, prefix_ttft
from .pressure import PressureResult, memory_pressure
from .pressure import _run_together as _run_together  # the tests drive a scripted engine
from .tables import markdown, table_lines

__all__ = [
    "CacheMiss",
    "PrefixResult",
    "PressureResult",
    "markdown",
    "memory_pressure",
    "prefix_ttft",
    "table_lines",
]
