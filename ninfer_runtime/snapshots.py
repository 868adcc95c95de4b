"""Checkpoints and the snapshots of slot states they keep in pages.

A prefix-cache checkpoint holds the K/V pages covering its tokens (shared with the sequence
that wrote them) and a **snapshot**: a copy of the sequence's slot states (GDN's recurrent
and convolution states, ...) written byte for byte into pages of its own, laid end to end
across the paged layers' page memory. So the pages stay the one shared store, and a
checkpoint costs whole pages like everything else in the pool.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from types import ModuleType
from typing import Any

Array = Any


@dataclass(frozen=True)
class Checkpoint:
    """A sequence's memory after ``length`` consumed tokens, kept when it moves on or ends:
    the K/V pages covering them (shared: the pool counts each page's holders), the pages its
    slot states were copied into (``snapshot``, its own), and with speculative decoding the
    main model's hidden row of the last token (the drafter pairs it with the next token; the
    MTP entries of the tokens before it are in the pages)."""

    length: int
    pages: tuple[int, ...]
    snapshot: tuple[int, ...]
    hidden: Array | None = None
    #: the last token's logits [V], when kept: a request whose whole prompt this is starts
    #: generating from them with nothing to prefill
    logits: Array | None = None
    #: why it was kept (``prefix_cache.CHECKPOINT_KINDS``)
    kind: str = "prompt_end"


@dataclass(frozen=True)
class SnapshotCopy:
    """One contiguous run of a snapshot: ``size`` bytes from byte ``state_at`` of state part
    ``state`` (``ContextPool.state_parts``) to byte ``page_at`` of the snapshot's ``page``-th
    page in page part ``part``."""

    state: int
    state_at: int
    page: int
    part: int
    page_at: int
    size: int


def plan_snapshot(page_parts: list[Array], state_parts: list[Array]) -> list[SnapshotCopy]:
    """Where each byte of a sequence's slot states goes in a snapshot: the states laid
    end to end, filling page after page (each page its parts one after the other). Empty
    when there is no page memory (or nothing to copy)."""
    row_bytes = [part[0].nbytes for part in page_parts]
    if not sum(row_bytes):
        return []
    plan, page, part, at = [], 0, 0, 0
    for state, source in enumerate(state_parts):
        done, size = 0, source[0].nbytes
        while done < size:
            n = min(size - done, row_bytes[part] - at)
            plan.append(SnapshotCopy(state, done, page, part, at, n))
            done, at = done + n, at + n
            if at == row_bytes[part]:
                part, at = part + 1, 0
                if part == len(row_bytes):
                    page, part = page + 1, 0
    return plan


def snapshot_pages(plan: list[SnapshotCopy]) -> int:
    """Pages one snapshot of this plan takes."""
    return max((c.page for c in plan), default=-1) + 1


def copy_snapshot(
    xp: ModuleType,
    plan: list[SnapshotCopy],
    page_parts: list[Array],
    state_parts: list[Array],
    slot: int,
    pages: tuple[int, ...],
    *,
    restore: bool,
    states: Collection[int] | None = None,
) -> None:
    """Slot ``slot``'s states into the snapshot ``pages`` (``restore``: back); ``states``:
    only those state parts (by index), else all."""

    def row_bytes(array: Array, row: int) -> Array:
        return array[row].reshape(-1).view(xp.uint8)

    for c in plan:
        if states is not None and c.state not in states:
            continue
        state = row_bytes(state_parts[c.state], slot)[c.state_at : c.state_at + c.size]
        page = row_bytes(page_parts[c.part], pages[c.page])[c.page_at : c.page_at + c.size]
        if restore:
            state[...] = page
        else:
            page[...] = state
