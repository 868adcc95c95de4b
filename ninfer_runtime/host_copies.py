"""A paused sequence's memory in host memory: what preemption saves and restores.

When the pool runs out of pages the scheduler pauses a sequence: its page rows, slot states
and drafter's hidden rows are copied to the host (``save``) and its slot and pages given
back; when pages free up, a fresh sequence is opened and filled with exactly what was saved
(``restore``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .arrays import host_copy
from .errors import EngineError
from .pool_sizing import slot_bytes_of, with_mtp

if TYPE_CHECKING:
    from .sequence_state import SequenceState
    from .state import ContextPool

Array = Any


@dataclass(frozen=True)
class HostCopy:
    """A paused sequence's memory in host memory (``ContextPool.save``): the rows of the
    pages covering its ``length`` tokens per page part, its slot's states per slot part,
    and with speculative decoding its hidden rows and where its drafter stands."""

    length: int
    mtp_length: int
    draft_carry: tuple[int, ...]
    pages: tuple[Array, ...]
    states: tuple[Array, ...]
    draft_hidden: Array | None

    @property
    def nbytes(self) -> int:
        parts = [*self.pages, *self.states]
        if self.draft_hidden is not None:
            parts.append(self.draft_hidden)
        return sum(int(part.nbytes) for part in parts)


def host_bytes(pool: ContextPool, state: SequenceState) -> int:
    """Bytes ``save(pool, state)`` takes in host memory."""
    hidden = pool.draft_hidden[0].nbytes if pool.draft_hidden is not None else 0
    states = slot_bytes_of(with_mtp(pool.specs, pool.mtp_spec))
    return pool.pages_for(state.length) * pool.page_bytes + states + hidden


def save(pool: ContextPool, state: SequenceState) -> HostCopy:
    """``state``'s memory copied to host memory (the state itself is left as it is)."""
    pages = pool.xp.asarray(state.pages[: pool.pages_for(state.length)])
    hidden = pool.draft_hidden
    return HostCopy(
        state.length,
        state.mtp_length,
        tuple(state.draft_carry),
        tuple(host_copy(part[pages]) for part in pool.page_parts()),
        tuple(host_copy(part[state.slot]) for part in pool.state_parts()),
        None if hidden is None else host_copy(hidden[state.slot]),
    )


def restore(pool: ContextPool, saved: HostCopy, tokens: int) -> SequenceState:
    """A sequence of ``pool`` with room for ``tokens`` tokens holding exactly what ``saved``
    held."""
    if tokens <= saved.length:
        raise EngineError(f"restore: {tokens} tokens cannot hold {saved.length}")
    state = pool.open(tokens)
    xp = pool.xp
    pages = xp.asarray(state.pages[: pool.pages_for(saved.length)])
    for part, rows in zip(pool.page_parts(), saved.pages, strict=True):
        part[pages] = xp.asarray(rows)
    for part, row in zip(pool.state_parts(), saved.states, strict=True):
        part[state.slot] = xp.asarray(row)
    if saved.draft_hidden is not None:
        pool.draft_hidden[state.slot] = xp.asarray(saved.draft_hidden)  # type: ignore[index]
    state.length, state.mtp_length = saved.length, saved.mtp_length
    state.draft_carry = list(saved.draft_carry)
    return state
