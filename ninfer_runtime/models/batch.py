"""How one forward call's rows are laid out: lanes stacked into one matrix.

Projections and MLPs see all lanes' rows at once (one matrix product per weight). The mixers
(attention over a cache, the Gated DeltaNet scan) need each lane's memory: a prefill chunk
walks its lanes one by one, while a decode step (one token per lane) addresses every lane's
memory at once through device index arrays (``DecodeIndex``), so the step runs without a
host round trip and can be captured in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..backends.base import to_numpy
from ..state import SequenceState

Array = Any


@dataclass(frozen=True)
class Mark:
    """A checkpoint kept inside a prefill read, after the lane's first ``row`` rows: each
    layer that keeps states in the lane's slot hands ``save`` the state arrays it advances
    (the pool's slot-indexed parts) once it has read those rows and no more
    (``Lane.segments``)."""

    row: int
    save: Callable[[Sequence[Any]], None]


@dataclass(frozen=True)
class Lane:
    """``rows`` of the stacked batch belong to one sequence; they fill positions
    ``start .. start + tokens - 1`` of ``state``; ``marks``: checkpoints kept on the way
    (rows in increasing order, inside the lane's)."""

    rows: slice
    start: int
    state: SequenceState
    marks: tuple[Mark, ...] = ()

    @property
    def tokens(self) -> int:
        return self.rows.stop - self.rows.start

    def segments(self) -> list[tuple[slice, Mark | None]]:
        """The lane's rows cut at its marks, each piece with the mark that ends it (None
        for the last): a layer with slot states reads the pieces in order and saves its
        memory at each mark."""
        pieces, at = [], self.rows.start
        for mark in self.marks:
            pieces.append((slice(at, self.rows.start + mark.row), mark))
            at = self.rows.start + mark.row
        return [*pieces, (slice(at, self.rows.stop), None)]


@dataclass(frozen=True)
class DecodeIndex:
    """Rows addressed on the device: row i is the token at ``positions[i]`` of the sequence
    in pool slot ``slots[i]`` (int32 [N] each); ``page_table`` is the pool's.

    ``tokens`` rows per lane, lane-major: 1 is a decode step; more is a speculative
    verification (row i*T + j is lane i's j-th token), whose recurrent layers run the tokens
    one after another without changing the lanes' states (``commit`` folds in the accepted
    ones) and whose attention layers store every row's keys and values.
    """

    slots: Array
    positions: Array
    page_table: Array
    tokens: int = 1

    @property
    def lane_slots(self) -> Array:
        """Each lane's slot (int32 [N / tokens])."""
        return self.slots[:: self.tokens]

    @cached_property
    def host_slots(self) -> list[int]:
        """``slots`` read on the host, once a step for every layer that reads them there (a
        step that does synchronises, so it is never captured)."""
        return to_numpy(self.slots).tolist()

    @cached_property
    def host_positions(self) -> list[int]:
        """``positions`` read on the host, once a step (as ``host_slots``)."""
        return to_numpy(self.positions).tolist()


@dataclass(frozen=True)
class Batch:
    lanes: tuple[Lane, ...]
    cos: Array  # [N, rotary_dim] RoPE tables of every row's position (None: no attention)
    sin: Array
    decode: DecodeIndex | None = None  # rows addressed on the device (decode, verification)

    @property
    def rows(self) -> int:
        return self.lanes[-1].rows.stop if self.lanes else 0

    @cached_property
    def row_addresses(self) -> tuple[Array, Array, Array]:
        """A prefill chunk's rows as (slots, positions, page table): each row's pool slot and
        position (int32 [N] each, made on the device once a forward) and the pool's page
        table, so every layer stores all lanes' rows in one call, as a decode step does."""
        pool = self.lanes[0].state.pool
        xp = pool.xp
        slots = [xp.full(lane.tokens, lane.state.slot, dtype=xp.int32) for lane in self.lanes]
        positions = [
            xp.arange(lane.start, lane.start + lane.tokens, dtype=xp.int32) for lane in self.lanes
        ]
        if len(self.lanes) > 1:
            return xp.concatenate(slots), xp.concatenate(positions), pool.page_table
        return slots[0], positions[0], pool.page_table

    def each_lane(self, fn: Callable[[Lane], Array], xp: Any) -> Array:
        """``fn(lane)`` for every lane, stacked in row order (one lane's result as it is,
        without a copy)."""
        outs = [fn(lane) for lane in self.lanes]
        return outs[0] if len(outs) == 1 else xp.concatenate(outs)

    def each_piece(
        self, fn: Callable[[Lane, slice], Array], states: Sequence[Array], xp: Any
    ) -> Array:
        """``fn(lane, rows)`` for every lane's pieces in order (``Lane.segments``: its rows
        cut at its marks), the slot ``states`` it advances saved at each mark; stacked in
        row order. A layer with slot states reads a prefill chunk so."""

        def lane_rows(lane: Lane) -> Array:
            outs = []
            for rows, mark in lane.segments():
                outs.append(fn(lane, rows))
                if mark is not None:
                    mark.save(states)
            return outs[0] if len(outs) == 1 else xp.concatenate(outs)

        return self.each_lane(lane_rows, xp)
