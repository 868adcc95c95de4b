"""Context memory: one pool per engine, a slot and some pages per sequence.

What a sequence keeps depends on its layers, and each layer's op family says what that is
(``memory_kinds``: a model declares a memory kind per layer; Qwen3.5's full-attention layers
keep K/V that grow with the context, ``ops/attention/memory.py``, its Gated DeltaNet layers a
fixed-size recurrent matrix per value head plus the last few convolution inputs,
``ops/delta_rule/memory.py``). The pool holds every kind, allocated once with explicit
shapes, and knows none by name:

* **pages** of ``page_tokens`` tokens hold what grows with the context (K/V:
  ``[pages, page_tokens, Nkv, D]`` per attention layer); a sequence owns a list of page ids
  (the same ids in every paged layer), written into row ``slot`` of the device ``page_table``.
* **slots** hold what has a fixed size per sequence (GDN: ``[slots, Hv, dk, dv]`` and
  ``[slots, C, K-1]`` per layer); a running sequence owns one slot (its lane's).

The pages are the one shared store: K/V of running sequences, K/V that prefix-cache
checkpoints keep, and the checkpoints' copies of the slot states (a **snapshot** is written
into ``snapshot_pages`` pages of its own, byte for byte across the paged layers' page
memory), so pages go wherever the workload needs them. Every buffer keeps its address for
the life of the pool, so a decode step addresses sequences by (slot, position) indices alone
and a GPU backend can capture it once in a CUDA graph. ``ContextPool.for_budget`` is the one
place a pool's size is worked out (from ``pool_sizing``).

``ContextPool`` coordinates; the pieces live beside it: ``pool_sizing`` (bytes per page and
slot, pages a budget buys), ``page_allocator`` (free pages and their holders),
``sequence_state`` (a sequence's slot, pages and length), ``snapshots`` (checkpoints and the
slot-state copies they keep in pages), ``pool_checkpoints`` (keeping, dropping and resuming
from them: a base class) and ``host_copies`` (preemption's save and restore).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property
from types import ModuleType
from typing import Any

import numpy as np

from . import host_copies
from .errors import EngineError

# SequenceState, Checkpoint, HostCopy, DraftSpec and PAGE_TOKENS are also imported from here
# (the scheduler, the models, the bench and the tests name the pool's types through it)
from .host_copies import HostCopy

# KV_DTYPES, load_kv and store_kv are re-exported: the CLIs, the server's settings and the
# bench name the K/V storage through this module
from .kv_storage import (  # noqa: F401
    KV_DTYPES,
    KV_SETTINGS,
    kv_storage_dtype,
    load_kv,
    resolve_kv_dtype,
    store_kv,
)
from .memory_kinds import LayerMemory, MemoryKind
from .page_allocator import PageAllocator
from .pool_checkpoints import PoolCheckpoints
from .pool_sizing import (
    PAGE_TOKENS,
    DraftSpec,
    page_bytes_of,
    planned_bytes,
    planned_pages,
    record_rows,
    slot_bytes_of,
    with_mtp,
)
from .sequence_state import SequenceState
from .snapshots import Checkpoint, SnapshotLayout

Array = Any


class PoolFull(EngineError):
    """The pool has no free slot, or too few free pages, for a request right now."""


class ContextPool(PoolCheckpoints):
    """Slots and pages for up to ``slots`` sequences (see the module docstring)."""

    def __init__(
        self,
        specs: Sequence[MemoryKind],
        xp: ModuleType,
        *,
        slots: int,
        pages: int,
        max_context: int,
        mtp: MemoryKind | None = None,
        draft: DraftSpec | None = None,
        step_rows: int = 1,
        page_tokens: int = PAGE_TOKENS,
        kv_dtype: str = "float32",
    ):
        if slots <= 0 or max_context <= 0 or page_tokens <= 0:
            raise EngineError("a context pool needs positive slots, max_context and page_tokens")
        kv_storage_dtype(kv_dtype)  # a clear error for an unknown one, whatever the layers
        self.xp, self.page_tokens, self.max_context = xp, page_tokens, max_context
        self.kv_dtype = kv_dtype
        self.specs, self.mtp_spec, self.draft = list(specs), mtp, draft
        self.max_pages = math.ceil(max_context / page_tokens)
        self.pages = pages
        #: the most tokens of one lane ``runner.forward`` runs as one compiled step
        self.step_rows = step_rows
        size: dict[str, Any] = {
            "slots": slots,
            "pages": pages,
            "page_tokens": page_tokens,
            "kv_dtype": kv_dtype,
            "record_rows": record_rows(draft, step_rows),
        }
        #: each layer's memory (``memory_kinds.LayerMemory``), in the model's layer order
        self.layers: list[LayerMemory] = [kind.allocate(xp, **size) for kind in specs]
        #: speculative decoding: each slot's main-model hidden rows of its last verification
        self.draft_hidden = (
            xp.zeros((slots, draft.rows, draft.hidden), xp.float32) if draft else None
        )
        self.mtp = mtp.allocate(xp, **size) if mtp is not None else None
        # rows of unused slots point at page 0: reads there are masked, never trusted
        self.page_table = xp.zeros((slots, self.max_pages), dtype=xp.int32)
        self._free_slots = list(range(slots))[::-1]
        #: the free pages and each page's holders: the sequences and checkpoints whose
        #: tokens (or states) it stores
        self._pages = PageAllocator(pages)
        self._snapshot_layout = SnapshotLayout(self.page_parts(), self.state_parts())
        #: pages one snapshot of a sequence's slot states takes
        self.snapshot_pages = self._snapshot_layout.pages
        # states, and no page memory to keep them in: checkpoints cannot be kept
        self._keeps = bool(self.snapshot_pages) or not any(part.size for part in self.state_parts())
        #: pages snapshots take now
        self.snapshot_pages_used = 0

    # -------------------------------------------------------------------------- sizing
    @classmethod
    def for_budget(
        cls,
        specs: Sequence[MemoryKind],
        xp: ModuleType,
        *,
        lanes: int,
        max_context: int,
        budget: int | None = None,
        mtp: MemoryKind | None = None,
        draft: DraftSpec | None = None,
        step_rows: int = 1,
        snapshots: int = 0,
        page_tokens: int = PAGE_TOKENS,
        kv_dtype: str = "float32",
    ) -> ContextPool:
        """``lanes`` slots, and pages for every lane at ``max_context`` tokens plus
        ``snapshots`` snapshots of the slot states (prefix-cache checkpoints); with a
        ``budget``, as many pages as its bytes hold beside the lanes' slots (all
        of them when checkpoints are kept, else no more than the lanes can use)."""
        pages = planned_pages(
            specs,
            lanes=lanes,
            max_context=max_context,
            budget=budget,
            mtp=mtp,
            draft=draft,
            step_rows=step_rows,
            snapshots=snapshots,
            page_tokens=page_tokens,
            kv_dtype=kv_dtype,
        )
        return cls(
            specs,
            xp,
            slots=lanes,
            pages=pages,
            max_context=max_context,
            mtp=mtp,
            draft=draft,
            step_rows=step_rows,
            page_tokens=page_tokens,
            kv_dtype=kv_dtype,
        )

    # the sizing arithmetic (``pool_sizing``), where callers have always found it
    planned_pages = staticmethod(planned_pages)
    planned_bytes = staticmethod(planned_bytes)
    record_rows = staticmethod(record_rows)
    page_bytes_of = staticmethod(page_bytes_of)
    slot_bytes_of = staticmethod(slot_bytes_of)

    # fixed for the pool's life, and read every step (the server's memory gauges)
    @cached_property
    def page_bytes(self) -> int:
        return page_bytes_of(self.specs, self.mtp_spec, self.page_tokens, self.kv_dtype)

    @cached_property
    def slot_bytes(self) -> int:
        return slot_bytes_of(with_mtp(self.specs, self.mtp_spec), self.draft, self.step_rows)

    @property
    def slots(self) -> int:
        return int(self.page_table.shape[0])

    @property
    def capacity_tokens(self) -> int:
        """Tokens all the pages hold together (the longest sequence the pool can take)."""
        return self.pages * self.page_tokens

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    @property
    def free_pages(self) -> int:
        return self._pages.free

    def free_page_ids(self) -> list[int]:
        """The free page ids."""
        return self._pages.free_ids()

    def nbytes(self) -> int:
        return self.slots * self.slot_bytes + self.pages * self.page_bytes

    def holders(self) -> np.ndarray:
        """How many sequences and checkpoints hold each page (0: free)."""
        return self._pages.holders()

    # -------------------------------------------------------------------- sequences
    def pages_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.page_tokens)

    def can_open(self, tokens: int) -> bool:
        return bool(self._free_slots) and self.pages_for(tokens) <= self._pages.free

    def open(self, tokens: int, prefix: Checkpoint | None = None) -> SequenceState:
        """A sequence with room for ``tokens`` tokens: fresh (zeroed recurrent state), or
        continuing from ``prefix``: its full pages shared, its last partial page copied (the
        sequence will write the rest of it), its slot states copied back from the snapshot."""
        if not 0 < tokens <= self.max_context:
            raise EngineError(f"a sequence needs 1..{self.max_context} tokens, asked {tokens}")
        need = self.pages_for(tokens)
        shared = list(prefix.pages[: prefix.length // self.page_tokens]) if prefix else []
        if prefix is not None and prefix.length >= tokens:
            raise EngineError(f"a {tokens}-token sequence cannot continue {prefix.length} tokens")
        if not self._free_slots:
            raise PoolFull(f"context pool: all {self.slots} slots are in use")
        if need - len(shared) > self._pages.free:
            raise PoolFull(
                f"context pool: {tokens} tokens need {need - len(shared)} pages, "
                f"{self._pages.free} free"
            )
        slot = self._free_slots.pop()
        self._pages.hold(shared)
        pages = shared + self._pages.take(need - len(shared))
        row = np.zeros(self.max_pages, dtype=np.int32)
        row[:need] = pages
        self.page_table[slot] = self.xp.asarray(row)
        state = SequenceState(self, slot, pages, min(tokens, need * self.page_tokens))
        if prefix is None:
            state.reset()
        else:  # the snapshot holds every slot state: all of them are copied back, none zeroed
            self._resume(state, prefix)
        return state

    def advance(self, state: SequenceState, tokens: int) -> None:
        """Count ``tokens`` more tokens of ``state`` as read without computing them (their
        K/V and states are whatever its pages and slot hold): a benchmark's way to decode at
        a context without prefilling it, made by a call so that every rank of a tensor-parallel
        run makes it too."""
        if not 0 <= tokens <= state.max_context - state.length:
            raise EngineError(
                f"advance by {tokens}: the sequence has room for "
                f"{state.max_context - state.length} more tokens"
            )
        state.length += tokens

    def grow(self, state: SequenceState) -> bool:
        """Room for more tokens in ``state``: the rest of its last page, else one more page
        (False: none is free, or it has all it may have)."""
        held = min(len(state.pages) * self.page_tokens, self.max_context)
        if state.max_context < held:
            state.max_context = held
            return True
        if not self._pages.free or len(state.pages) >= self.max_pages:
            return False
        (page,) = self._pages.take(1)
        self.page_table[state.slot, len(state.pages)] = page
        state.pages.append(page)
        state.max_context = min(len(state.pages) * self.page_tokens, self.max_context)
        return True

    # the host copies of preemption (``host_copies``)
    def host_bytes(self, state: SequenceState) -> int:
        """Bytes ``save(state)`` takes in host memory."""
        return host_copies.host_bytes(self, state)

    def save(self, state: SequenceState) -> HostCopy:
        """``state``'s memory copied to host memory (the state itself is left as it is)."""
        return host_copies.save(self, state)

    def restore(self, saved: HostCopy, tokens: int) -> SequenceState:
        """A sequence with room for ``tokens`` tokens holding exactly what ``saved`` held."""
        return host_copies.restore(self, saved, tokens)

    def close(self, state: SequenceState) -> None:
        """Give a sequence's slot and pages back (the state must not be used afterwards)."""
        if state.pool is not self or state.slot < 0:
            raise EngineError("close: this state does not belong to this pool (or was closed)")
        self._pages.release(state.pages)
        self._free_slots.append(state.slot)
        state.slot, state.pages, state.max_context = -1, [], 0

    def memories(self) -> list[LayerMemory]:
        """Every layer's memory: the model's layers in order, then the MTP layer's."""
        return self.layers + ([self.mtp] if self.mtp is not None else [])

    def page_parts(self) -> list[Array]:
        """The arrays whose row ``p`` is page ``p``'s memory, in the order snapshots fill it."""
        return [part for memory in self.memories() for part in memory.page_parts()]

    def state_parts(self) -> list[Array]:
        """The arrays whose row ``slot`` is a sequence's states, in snapshot order."""
        return [part for memory in self.memories() for part in memory.slot_parts()]
