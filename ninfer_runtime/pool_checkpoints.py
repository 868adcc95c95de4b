"""Prefix-cache checkpoints in the context pool: ``keep`` one of a sequence at its length (its
K/V pages held, its slot states copied into snapshot pages of their own), ``drop`` one, and a
sequence opened from one resumed where it stood (``_resume``, for ``ContextPool.open``).

``PoolCheckpoints`` is a base of ``ContextPool``, the pool's own methods kept in a room of
their own: they work on what ``ContextPool.__init__`` sets up (``_pages``, the free pages and
their holders; ``_snapshot_layout``, ``snapshot_pages`` and ``_keeps``, where and whether slot
states fit in pages) and on its memory views (``memories``, ``page_parts``, ``state_parts``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from .sequence_state import SequenceState
from .snapshots import Checkpoint

Array = Any


class PoolCheckpoints:
    """Checkpoints kept, dropped and resumed from (``ContextPool``'s; see the module docstring)."""

    def keep(
        self,
        state: SequenceState,
        hidden: Array | None = None,
        logits: Array | None = None,
        kind: str = "prompt_end",
    ) -> Checkpoint | None:
        """A checkpoint of ``state`` at its length (None: fewer than ``snapshot_pages``
        pages are free, or no token yet). ``hidden``: the last token's hidden row, for
        speculative decoding; ``logits``: its logits; ``kind``: why it is kept."""
        snapshot = self.take_snapshot() if state.length else None
        if snapshot is None:
            return None
        self._copy_snapshot(state.slot, snapshot, restore=False)
        return self.keep_marked(state, state.length, snapshot, hidden, logits, kind)

    def take_snapshot(self) -> tuple[int, ...] | None:
        """Pages for a snapshot of slot states (``keep`` fills it at once; inside a forward
        the layers fill it, ``save_states``), that ``keep_marked`` makes a checkpoint of
        (None: fewer than ``snapshot_pages`` pages are free); ``release_snapshot`` lets
        unused ones go."""
        if not self._keeps or self._pages.free < self.snapshot_pages:
            return None
        snapshot = tuple(self._pages.take(self.snapshot_pages))
        self.snapshot_pages_used += len(snapshot)
        return snapshot

    def save_states(
        self, states: Sequence[Array], targets: Sequence[tuple[int, tuple[int, ...]]]
    ) -> None:
        """For every (slot, snapshot) of ``targets``: slot ``slot``'s rows of some of the
        pool's state arrays (``state_parts``: one layer's, or part of one's) into their share
        of ``snapshot``, all in one copy."""
        chosen = self._snapshot_layout.state_indices(states)
        self._snapshot_layout.copy(targets, restore=False, states=chosen)

    def keep_marked(
        self,
        state: SequenceState,
        length: int,
        snapshot: tuple[int, ...],
        hidden: Array | None = None,
        logits: Array | None = None,
        kind: str = "prompt_end",
    ) -> Checkpoint:
        """A checkpoint of ``state``'s first ``length`` tokens from a ``snapshot`` of its
        slot states after them (``keep`` copies them at the state's length; inside a forward
        its layers fill it as they pass ``length``, ``save_states``); ``hidden`` and
        ``logits`` as ``keep``'s, of token ``length - 1``."""
        pages = tuple(state.pages[: self.pages_for(length)])
        self._pages.hold(pages)

        def copy(x: Array | None) -> Array | None:
            return None if x is None else self.xp.array(x, copy=True)

        return Checkpoint(length, pages, snapshot, copy(hidden), copy(logits), kind)

    def release_snapshot(self, snapshot: tuple[int, ...]) -> None:
        """Snapshot pages that no checkpoint came of."""
        self._pages.release(list(snapshot))
        self.snapshot_pages_used -= len(snapshot)

    def drop(self, checkpoint: Checkpoint) -> None:
        """Let a checkpoint go: its snapshot's pages, and its hold on its K/V pages."""
        self._pages.release(list(checkpoint.pages))
        self.release_snapshot(checkpoint.snapshot)

    def _resume(self, state: SequenceState, prefix: Checkpoint) -> None:
        rows = prefix.length % self.page_tokens
        if rows:  # the partial page: a copy of the rows the prefix wrote
            src, dst = (
                prefix.pages[len(prefix.pages) - 1],
                state.pages[prefix.length // self.page_tokens],
            )
            for memory in self.memories():
                memory.copy_tokens(src, dst, rows)
        self._copy_snapshot(state.slot, prefix.snapshot, restore=True)
        state.length = prefix.length
        state.resumed_logits = prefix.logits
        if prefix.hidden is not None and self.draft_hidden is not None:
            self.draft_hidden[state.slot, 0] = prefix.hidden
            state.mtp_length = prefix.length - 1

    def _copy_snapshot(
        self,
        slot: int,
        pages: tuple[int, ...],
        *,
        restore: bool,
        states: Collection[int] | None = None,
    ) -> None:
        """Slot ``slot``'s states into the snapshot ``pages`` (``restore``: back); ``states``:
        only those state parts."""
        self._snapshot_layout.copy([(slot, pages)], restore=restore, states=states)
