"""How one forward call's rows are laid out: lanes stacked into one matrix.

Projections and MLPs see all lanes' rows at once (one matrix product per weight); the mixers
(attention over a cache, the Gated DeltaNet scan) walk the lanes, because each lane has its own
memory. A prefill chunk is one lane with T rows; batched decode is many lanes with one row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Array = Any


@dataclass(frozen=True)
class Lane:
    """``rows`` of the stacked batch belong to one sequence; they fill cache slots
    ``start .. start + tokens - 1`` of that sequence's state."""

    rows: slice
    start: int

    @property
    def tokens(self) -> int:
        return self.rows.stop - self.rows.start


@dataclass(frozen=True)
class Batch:
    lanes: tuple[Lane, ...]
    cos: Array  # [N, rotary_dim] RoPE tables of every row's position (None: no attention)
    sin: Array

    @property
    def rows(self) -> int:
        return self.lanes[-1].rows.stop if self.lanes else 0
