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
place a pool's size is worked out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from .arrays import host_copy
from .errors import EngineError

# KV_DTYPES, load_kv and store_kv are re-exported: the CLIs, the server's settings and the
# bench name the K/V storage through this module
from .kv_storage import KV_DTYPES, kv_storage_dtype, load_kv, store_kv  # noqa: F401
from .memory_kinds import LayerMemory, MemoryKind
from .sizes import format_size

Array = Any

#: tokens per K/V page (the decode attention kernel reads one page at a time)
PAGE_TOKENS = 256


@dataclass(frozen=True)
class DraftSpec:
    """What speculative decoding keeps per sequence for a round of ``rows`` positions (the
    draft tokens plus one): the main model's hidden rows of the last verification, which
    the MTP block continues from, and each layer's record of the verified rows (a memory
    kind's ``record_bytes``; GDN: each row's inputs, from which the accepted prefix is folded
    into the states)."""

    rows: int
    hidden: int


class PoolFull(EngineError):
    """The pool has no free slot, or too few free pages, for a request right now."""


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


@dataclass
class SequenceState:
    """The memory of one sequence: a slot of the pool and the pages it reserved.

    ``length`` tokens have been consumed by the main model (their K/V are stored and their
    effect is folded into the GDN states). The MTP layer keeps its own K/V in the same pages:
    entry j is built from hidden state j and token j+1; ``mtp_length`` counts those entries.
    ``max_context`` is what the reserved pages hold.

    With speculative decoding, ``draft_carry`` are the tokens that pair with the hidden rows
    kept in the pool's ``draft_hidden`` for this slot and whose MTP entries (from slot
    ``mtp_length`` on) the next round writes first: the drafts the last round accepted (the
    token after them, not yet consumed, is the caller's pending token).
    """

    pool: ContextPool
    slot: int
    pages: list[int]
    max_context: int
    length: int = 0
    mtp_length: int = 0
    draft_carry: list[int] = field(default_factory=list)
    #: when opened from a checkpoint that kept them: its last token's logits
    resumed_logits: Array | None = None
    #: a prompt with images: the RoPE position of every token after it is its index plus
    #: this (``models.qwen3_5.mrope``; <= 0, an image advances positions by its longer side)
    rope_delta: int = 0

    @property
    def free(self) -> int:
        """Tokens the main model can still take before the reserved pages are full."""
        return self.max_context - self.length

    @property
    def page_ids(self) -> Array:
        """The sequence's page ids in order, on the pool's device: its row of the page table
        (int32 [max_pages]; entries past its own pages name nothing of it)."""
        return self.pool.page_table[self.slot]

    def addresses(self, start: int, count: int) -> tuple[Array, Array]:
        """(page id, row in page) of tokens ``start .. start + count - 1``, as device arrays
        computed on the device from ``page_ids`` (a host array copied over would make the
        stream wait for the device)."""
        positions = self.pool.xp.arange(start, start + count)
        p = self.pool.page_tokens
        return self.page_ids[positions // p], positions % p

    def reset(self) -> None:
        """Forget the sequence (each layer resets its slot: recurrent states are zeroed, K/V
        rows are simply overwritten)."""
        self.length = 0
        self.mtp_length = 0
        self.draft_carry = []
        for memory in self.pool.memories():
            memory.reset(self.slot)

    def nbytes(self) -> int:
        """Bytes of the pool this sequence holds (its slot and its pages)."""
        return self.pool.slot_bytes + len(self.pages) * self.pool.page_bytes


class ContextPool:
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
            "record_rows": self.record_rows(draft, step_rows),
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
        self._free_pages = list(range(pages))[::-1]
        #: holders of each page: the sequences and checkpoints whose tokens (or states) it
        #: stores
        self._holders = np.zeros(pages, dtype=np.int64)
        self._snapshot_plan = self._plan_snapshots()
        #: pages one snapshot of a sequence's slot states takes
        self.snapshot_pages = max((c.page for c in self._snapshot_plan), default=-1) + 1
        # states, and no page memory to keep them in: checkpoints cannot be kept
        self._keeps = bool(self._snapshot_plan) or not any(
            part.size for part in self._state_parts()
        )
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
        pages = cls.planned_pages(
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

    @classmethod
    def planned_pages(
        cls,
        specs: Sequence[MemoryKind],
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
    ) -> int:
        """The pages ``for_budget`` gives a pool of these arguments."""
        if lanes <= 0 or max_context <= 0 or page_tokens <= 0:
            raise EngineError("a context pool needs positive slots, max_context and page_tokens")
        page_bytes = cls.page_bytes_of(specs, mtp, page_tokens, kv_dtype)
        kinds = _with_mtp(specs, mtp)
        pages = lanes * math.ceil(max_context / page_tokens)
        if snapshots and page_bytes:
            pages += snapshots * math.ceil(cls.slot_bytes_of(kinds) / page_bytes)
        if budget is not None:
            slot_bytes = lanes * cls.slot_bytes_of(kinds, draft, step_rows)
            held = (budget - slot_bytes) // max(page_bytes, 1)
            # with checkpoints to keep, every page is of use; without, only the lanes' own
            pages = held if snapshots else min(held, pages)
            if pages < 1:
                need = slot_bytes + page_bytes
                raise EngineError(
                    f"context capacity {format_size(budget)} holds no K/V page: {lanes} lanes "
                    f"need {format_size(slot_bytes)} of recurrent state plus "
                    f"{format_size(page_bytes)} per {page_tokens}-token page "
                    f"(>= {format_size(need)})"
                )
        return int(pages)

    @classmethod
    def planned_bytes(cls, specs: Sequence[MemoryKind], **plan: Any) -> int:
        """The bytes ``for_budget(specs, xp, **plan)`` would allocate (``nbytes``), known
        before anything is: what a ``--vram-budget`` plans the experts beside."""
        pages = cls.planned_pages(specs, **plan)
        mtp, draft = plan.get("mtp"), plan.get("draft")
        slot = cls.slot_bytes_of(_with_mtp(specs, mtp), draft, plan.get("step_rows", 1))
        page = cls.page_bytes_of(
            specs, mtp, plan.get("page_tokens", PAGE_TOKENS), plan.get("kv_dtype", "float32")
        )
        return plan["lanes"] * slot + pages * page

    @staticmethod
    def record_rows(draft: DraftSpec | None, step_rows: int) -> int:
        """Rows per lane the layers record for a multi-row step: the most of a compiled
        step's and a speculative round's."""
        return max(step_rows, draft.rows if draft else 1)

    @staticmethod
    def page_bytes_of(
        specs: Sequence[MemoryKind],
        mtp: MemoryKind | None,
        tokens: int,
        kv_dtype: str = "float32",
    ) -> int:
        """Bytes of one page of ``tokens`` tokens across the layers and the MTP layer."""
        return sum(kind.page_bytes(tokens, kv_dtype) for kind in _with_mtp(specs, mtp))

    @classmethod
    def slot_bytes_of(
        cls, specs: Sequence[MemoryKind], draft: DraftSpec | None = None, step_rows: int = 1
    ) -> int:
        """Bytes of one slot: the states of the layers ``specs`` (the MTP layer's too, where
        it keeps any), their records of a multi-row step, and a speculative round's hidden
        rows."""
        rows = cls.record_rows(draft, step_rows)
        size = sum(kind.slot_bytes() + kind.record_bytes(rows) for kind in specs)
        if draft is not None:
            size += draft.rows * 4 * draft.hidden
        return size

    @property
    def page_bytes(self) -> int:
        return self.page_bytes_of(self.specs, self.mtp_spec, self.page_tokens, self.kv_dtype)

    @property
    def slot_bytes(self) -> int:
        return self.slot_bytes_of(_with_mtp(self.specs, self.mtp_spec), self.draft, self.step_rows)

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
        return len(self._free_pages)

    def nbytes(self) -> int:
        return self.slots * self.slot_bytes + self.pages * self.page_bytes

    def holders(self) -> np.ndarray:
        """How many sequences and checkpoints hold each page (0: free)."""
        return self._holders.copy()

    # -------------------------------------------------------------------- sequences
    def pages_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.page_tokens)

    def can_open(self, tokens: int) -> bool:
        return bool(self._free_slots) and self.pages_for(tokens) <= len(self._free_pages)

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
        if need - len(shared) > len(self._free_pages):
            raise PoolFull(
                f"context pool: {tokens} tokens need {need - len(shared)} pages, "
                f"{len(self._free_pages)} free"
            )
        slot = self._free_slots.pop()
        pages = shared + [self._free_pages.pop() for _ in range(need - len(shared))]
        self._holders[pages] += 1
        row = np.zeros(self.max_pages, dtype=np.int32)
        row[:need] = pages
        self.page_table[slot] = self.xp.asarray(row)
        state = SequenceState(self, slot, pages, min(tokens, need * self.page_tokens))
        state.reset()
        if prefix is not None:
            self._resume(state, prefix)
        return state

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
        if not self._free_pages or len(state.pages) >= self.max_pages:
            return False
        page = self._free_pages.pop()
        self._holders[page] += 1
        self.page_table[state.slot, len(state.pages)] = page
        state.pages.append(page)
        state.max_context = min(len(state.pages) * self.page_tokens, self.max_context)
        return True

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
        if not self._keeps or len(self._free_pages) < self.snapshot_pages or not state.length:
            return None
        snapshot = tuple(self._free_pages.pop() for _ in range(self.snapshot_pages))
        self._holders[list(snapshot)] += 1
        self.snapshot_pages_used += len(snapshot)
        self._copy_snapshot(state.slot, snapshot, restore=False)
        pages = tuple(state.pages[: self.pages_for(state.length)])
        self._holders[list(pages)] += 1

        def copy(x: Array | None) -> Array | None:
            return None if x is None else self.xp.array(x, copy=True)

        return Checkpoint(state.length, pages, snapshot, copy(hidden), copy(logits), kind)

    def drop(self, checkpoint: Checkpoint) -> None:
        """Let a checkpoint go: its snapshot's pages, and its hold on its K/V pages."""
        self._release(list(checkpoint.pages) + list(checkpoint.snapshot))
        self.snapshot_pages_used -= len(checkpoint.snapshot)

    def host_bytes(self, state: SequenceState) -> int:
        """Bytes ``save(state)`` takes in host memory."""
        hidden = self.draft_hidden[0].nbytes if self.draft_hidden is not None else 0
        states = self.slot_bytes_of(_with_mtp(self.specs, self.mtp_spec))
        return self.pages_for(state.length) * self.page_bytes + states + hidden

    def save(self, state: SequenceState) -> HostCopy:
        """``state``'s memory copied to host memory (the state itself is left as it is)."""
        pages = self.xp.asarray(state.pages[: self.pages_for(state.length)])
        hidden = self.draft_hidden
        return HostCopy(
            state.length,
            state.mtp_length,
            tuple(state.draft_carry),
            tuple(host_copy(part[pages]) for part in self._page_parts()),
            tuple(host_copy(part[state.slot]) for part in self._state_parts()),
            None if hidden is None else host_copy(hidden[state.slot]),
        )

    def restore(self, saved: HostCopy, tokens: int) -> SequenceState:
        """A sequence with room for ``tokens`` tokens holding exactly what ``saved`` held."""
        if tokens <= saved.length:
            raise EngineError(f"restore: {tokens} tokens cannot hold {saved.length}")
        state = self.open(tokens)
        xp = self.xp
        pages = xp.asarray(state.pages[: self.pages_for(saved.length)])
        for part, rows in zip(self._page_parts(), saved.pages, strict=True):
            part[pages] = xp.asarray(rows)
        for part, row in zip(self._state_parts(), saved.states, strict=True):
            part[state.slot] = xp.asarray(row)
        if saved.draft_hidden is not None:
            self.draft_hidden[state.slot] = xp.asarray(saved.draft_hidden)  # type: ignore[index]
        state.length, state.mtp_length = saved.length, saved.mtp_length
        state.draft_carry = list(saved.draft_carry)
        return state

    def close(self, state: SequenceState) -> None:
        """Give a sequence's slot and pages back (the state must not be used afterwards)."""
        if state.pool is not self or state.slot < 0:
            raise EngineError("close: this state does not belong to this pool (or was closed)")
        self._release(state.pages)
        self._free_slots.append(state.slot)
        state.slot, state.pages, state.max_context = -1, [], 0

    def _release(self, pages: list[int]) -> None:
        self._holders[pages] -= 1
        self._free_pages.extend(p for p in reversed(pages) if self._holders[p] == 0)

    def memories(self) -> list[LayerMemory]:
        """Every layer's memory: the model's layers in order, then the MTP layer's."""
        return self.layers + ([self.mtp] if self.mtp is not None else [])

    # -------------------------------------------------------------------- snapshots
    def _page_parts(self) -> list[Array]:
        """The arrays whose row ``p`` is page ``p``'s memory, in the order snapshots fill it."""
        return [part for memory in self.memories() for part in memory.page_parts()]

    def _state_parts(self) -> list[Array]:
        """The arrays whose row ``slot`` is a sequence's states, in snapshot order."""
        return [part for memory in self.memories() for part in memory.slot_parts()]

    def _plan_snapshots(self) -> list[_SnapshotCopy]:
        """Where each byte of a sequence's slot states goes in a snapshot: the states laid
        end to end, filling page after page (each page its parts one after the other)."""
        row_bytes = [part[0].nbytes for part in self._page_parts()]
        if not sum(row_bytes):
            return []
        plan, page, part, at = [], 0, 0, 0
        for state, source in enumerate(self._state_parts()):
            done, size = 0, source[0].nbytes
            while done < size:
                n = min(size - done, row_bytes[part] - at)
                plan.append(_SnapshotCopy(state, done, page, part, at, n))
                done, at = done + n, at + n
                if at == row_bytes[part]:
                    part, at = part + 1, 0
                    if part == len(row_bytes):
                        page, part = page + 1, 0
        return plan

    def _copy_snapshot(self, slot: int, pages: tuple[int, ...], *, restore: bool) -> None:
        """Slot ``slot``'s states into the snapshot ``pages`` (``restore``: back)."""
        states, page_parts = self._state_parts(), self._page_parts()

        def row_bytes(array: Array, row: int) -> Array:
            return array[row].reshape(-1).view(self.xp.uint8)

        for c in self._snapshot_plan:
            state = row_bytes(states[c.state], slot)[c.state_at : c.state_at + c.size]
            page = row_bytes(page_parts[c.part], pages[c.page])[c.page_at : c.page_at + c.size]
            if restore:
                state[...] = page
            else:
                page[...] = state


def _with_mtp(specs: Sequence[MemoryKind], mtp: MemoryKind | None) -> list[MemoryKind]:
    """The memory kinds of the layers ``specs`` and of the MTP layer, if any."""
    return [*specs, *([mtp] if mtp is not None else [])]


@dataclass(frozen=True)
class _SnapshotCopy:
    """One contiguous run of a snapshot: ``size`` bytes from byte ``state_at`` of state part
    ``state`` (``ContextPool._state_parts``) to byte ``page_at`` of the snapshot's ``page``-th
    page in page part ``part``."""

    state: int
    state_at: int
    page: int
    part: int
    page_at: int
    size: int
