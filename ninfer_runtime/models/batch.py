"""How one forward call's rows are laid out: lanes stacked into one matrix.

Projections and MLPs see all lanes' rows at once (one matrix product per weight). The mixers
(attention over a cache, the Gated DeltaNet scan) need each lane's memory: in a prefill chunk
attention walks its lanes one by one (after storing every lane's keys and values at once) and
a recurrent layer reads every lane's rows in one call (``each_round``), while a decode step
(one token per lane) addresses every lane's memory at once through device index arrays
(``DecodeIndex``), so the step runs without a host round trip and can be captured in a CUDA
graph.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..backends.base import to_numpy
from ..state import SequenceState

Array = Any
#: the fewest tokens a step's attention reads over its sequences (``token_bucket``)
FIRST_BUCKET = 256


def token_bucket(last_position: int) -> int:
    """How many tokens of its sequences a step whose rows reach ``last_position`` reads, for
    attention that reads them whole or scores them all (a token indexer's): the power of two
    past it, at least ``FIRST_BUCKET``. Chosen on the host before the step (the model's
    ``step_variant``), so a compiled step keeps one shape at every position inside its
    bucket; the rows past a sequence's position are never seen."""
    return max(FIRST_BUCKET, 1 << last_position.bit_length())


@dataclass(frozen=True)
class Mark:
    """A checkpoint kept inside a prefill read, after the lane's first ``row`` rows: each
    layer that keeps states in the lane's slot hands the state arrays it advances (the
    pool's slot-indexed parts) to ``saver`` once it has read those rows and no more
    (``Lane.segments``). ``saver(keys, states)`` saves them for every mark named by its
    ``key`` at once, so a round's marks cost one call (``save_marks``)."""

    row: int
    key: Any
    saver: Callable[[Sequence[Any], Sequence[Any]], None]

    def save(self, states: Sequence[Any]) -> None:
        """This mark's ``states`` saved."""
        self.saver([self.key], states)


def save_marks(marks: Sequence[Mark], states: Sequence[Any]) -> None:
    """Every mark's ``states`` saved, the marks that share a saver in one call."""
    groups: dict[Callable[..., None], list[Any]] = {}
    for mark in marks:
        groups.setdefault(mark.saver, []).append(mark.key)
    for saver, keys in groups.items():
        saver(keys, states)


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
class Piece:
    """``rows`` of a lane, ending at ``mark`` (None: at the lane's end): one lane's share of
    a round (``Batch.rounds``)."""

    lane: Lane
    rows: slice
    mark: Mark | None

    @property
    def segment(self) -> tuple[int, int, int]:
        """(first row, rows, slot): the piece as the delta_rule family's ``prefill`` takes it."""
        return (self.rows.start, self.rows.stop - self.rows.start, self.lane.state.slot)


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
    #: what the model chose for the step from the positions the host knows, made part of the
    #: compiled step's key (``Model.step_variant``; None: the model chooses nothing)
    variant: Hashable | None = None

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

    @cached_property
    def page_lanes(self) -> tuple[tuple[int, int, Any], ...]:
        """Every lane as (tokens, start, page ids): the attention family's ``prefill_lanes``
        takes them so. One tuple a forward, so a provider can keep what it derives from them
        (``varlen``'s key rows) for every layer of the step."""
        return tuple((lane.tokens, lane.start, lane.state.page_ids) for lane in self.lanes)

    def each_lane(self, fn: Callable[[Lane], Array], xp: Any) -> Array:
        """``fn(lane)`` for every lane, stacked in row order (one lane's result as it is,
        without a copy)."""
        outs = [fn(lane) for lane in self.lanes]
        return outs[0] if len(outs) == 1 else xp.concatenate(outs)

    def rounds(self) -> list[list[Piece]]:
        """The lanes' pieces (``Lane.segments``: each lane's rows cut at its marks) by
        round: round r holds every lane's r-th piece. A lane's pieces run through its states
        one after another, different lanes' independently, so a layer with slot states reads
        a round's pieces together and saves the marks that end them before the next round."""
        cut = [lane.segments() for lane in self.lanes]
        return [
            [Piece(lane, *pieces[r]) for lane, pieces in zip(self.lanes, cut, strict=True)
             if r < len(pieces)]
            for r in range(max((len(pieces) for pieces in cut), default=0))
        ]  # fmt: skip

    def each_round(self, fn: Callable[[list[Piece]], Array], states: Sequence[Array]) -> Array:
        """``fn(pieces)`` for every round (``rounds``), each giving [N, ...] with its pieces'
        rows written; the slot ``states`` the pieces advance saved at the marks that end
        them after each round, in one call (``save_marks``). -> the rows of every round (a
        single round's output as it is). A layer with slot states reads a prefill chunk so."""
        out = None
        for pieces in self.rounds():
            got = fn(pieces)
            if out is None:
                out = got
            else:
                for piece in pieces:
                    out[piece.rows] = got[piece.rows]
            save_marks([piece.mark for piece in pieces if piece.mark is not None], states)
        assert out is not None, "each_round: a batch without rows"
        return out

    def each_piece(
        self, fn: Callable[[Lane, slice], Array], states: Sequence[Array], xp: Any
    ) -> Array:
        """``fn(lane, rows)`` for every piece of every round (``each_round``), each one
        lane's rows: for a layer whose op reads one lane at a time."""

        def pieces_of(pieces: list[Piece]) -> Array:
            out = None
            for piece in pieces:
                got = fn(piece.lane, piece.rows)
                if out is None:
                    out = xp.empty((self.rows, *got.shape[1:]), dtype=got.dtype)
                out[piece.rows] = got
            return out

        return self.each_round(pieces_of, states)
