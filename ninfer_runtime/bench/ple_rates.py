"""What streamed PLE n-gram tables read during ``ninfer-bench run``, beside each measurement.

Qwen4Exp's n-gram tables are either resident (loaded whole) or streamed: a step reads the
rows its tokens hash to from the artifact through a bounded row cache
(``models/qwen4_exp/ple_rows.py``). For each decode row and the prefill of a model whose
tables are streamed, the rows a step looked up, the share the cache held, and the bytes read
from the artifact a step (those bytes are in the decode floor already: ``active_bytes``
counts the gathered rows a step reads). Nothing for resident tables or other models; run
once with ``--ple-rows resident`` and once with ``streamed`` to set the two side by side.
Warm-up steps count with the timed ones, as for the offload's lines.
"""

from __future__ import annotations

from typing import Any

import click


class PleReport:
    """The streamed tables' counters read around each measurement (nothing without them)."""

    def __init__(self, tables: Any):
        self.tables = tables  # models/qwen4_exp/ple_rows.StreamedTables, or None

    @classmethod
    def start(cls, model: Any) -> PleReport:
        """Said once: where the model's n-gram tables are read from (if it has any)."""
        tables = getattr(model, "ple_tables", None)
        if tables is not None:
            click.echo(
                f"PLE n-gram tables: streamed from the artifact through a "
                f"{tables.cache.capacity / 2**20:.0f} MiB row cache"
            )
        elif hasattr(model, "ple_tables"):
            click.echo("PLE n-gram tables: resident")
        return cls(tables)

    def reset(self) -> None:
        if self.tables is not None:
            self.tables.reset_counters()

    def read(self, label: str, steps: int) -> list[dict[str, Any]]:
        """The row of ``steps`` steps since ``reset``, also said."""
        if self.tables is None:
            return []
        read, cache = self.tables.counters(), self.tables.cache
        looked_up = cache.hits + cache.misses
        row = {
            "kind": "ple rows",
            "label": label,
            "steps": steps,
            "rows_looked_up": looked_up / steps,
            "cache_held": cache.hits / looked_up if looked_up else 0.0,
            "bytes_read": read.bytes / steps,
            "ranges_read": read.ranges / steps,
        }
        click.echo(
            f"PLE rows, {label}: {row['rows_looked_up']:.3g} looked up a step, "
            f"{row['cache_held']:.0%} held by the cache; {row['bytes_read'] / 1e6:.3g} MB "
            f"read from the artifact a step in {row['ranges_read']:.3g} ranges"
        )
        return [row]
