"""How one forward call's rows are laid out: lanes stacked into one matrix.

Projections and MLPs see all lanes' rows at once (one matrix product per weight). The mixers
(attention over a cache, the Gated DeltaNet scan) need each lane's memory: a prefill chunk
walks its lanes one by one, while a decode step (one token per lane) addresses every lane's
memory at once through device index arrays (``DecodeIndex``), so the step runs without a
host round trip and can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..state import SequenceState

Array = Any


@dataclass(frozen=True)
class Lane:
    """``rows`` of the stacked batch belong to one sequence; they fill positions
    ``start .. start + tokens - 1`` of ``state``."""

    rows: slice
    start: int
    state: SequenceState

    @property
    def tokens(self) -> int:
        return self.rows.stop - self.rows.start


@dataclass(frozen=True)
class DecodeIndex:
    """One token per row, all on the device: row i is the token at ``positions[i]`` of the
    sequence in pool slot ``slots[i]`` (int32 [N] each); ``page_table`` is the pool's."""

    slots: Array
    positions: Array
    page_table: Array


@dataclass(frozen=True)
class Batch:
    lanes: tuple[Lane, ...]
    cos: Array  # [N, rotary_dim] RoPE tables of every row's position (None: no attention)
    sin: Array
    decode: DecodeIndex | None = None  # set when every lane has exactly one token

    @property
    def rows(self) -> int:
        return self.lanes[-1].rows.stop if self.lanes else 0
