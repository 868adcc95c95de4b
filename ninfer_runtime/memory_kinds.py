"""What the context pool needs from a kind of layer memory, without knowing its name.

A model declares, per layer (and for its MTP layer), a **memory kind**: a frozen spec
(``MemoryKind``) of what the layer keeps per sequence. The pool (``state.ContextPool``) sizes
itself from the specs, has each spec allocate its layer's buffers once (``LayerMemory``; their
addresses stay fixed for the pool's life, since decode steps are captured in CUDA graphs) and
from then on handles every kind alike, through the parts a kind shows it:

* **page parts** grow with the context: arrays whose row ``p`` is page ``p``'s memory of the
  layer (a sequence owns a list of page ids, the same in every paged layer);
* **slot parts** have a fixed size per sequence: arrays whose row ``s`` is slot ``s``'s state
  (a running sequence owns one slot);
* a **record** of a multi-row step (a speculative verification, a prompt's short chunk) is
  slot memory the kind's own ops write and read within such a step; the pool allocates and
  counts it, and never saves or snapshots it.

A checkpoint's snapshot lays the slot parts of all layers end to end, byte for byte, across
the page parts of pages of its own (``ContextPool.keep``); a preemption's host copy takes the
page rows and slot rows as they are (``ContextPool.save``). The kinds live with their op
families (``ops/attention/memory.py``: K/V pages; ``ops/delta_rule/memory.py``: Gated DeltaNet
slots); a new kind is a class in its family and a model that declares it.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any, ClassVar, Protocol

Array = Any


class LayerMemory(Protocol):
    """One layer's buffers in a pool."""

    def page_parts(self) -> Sequence[Array]:
        """Arrays ``[pages, ...]`` whose row ``p`` is page ``p``'s memory, in the order a
        snapshot fills them (empty: the layer keeps nothing per page)."""
        ...

    def slot_parts(self) -> Sequence[Array]:
        """Arrays ``[slots, ...]`` whose row ``s`` is a sequence's state, in the order a
        snapshot and a host copy take them (empty: the layer keeps nothing per slot)."""
        ...

    def reset(self, slot: int) -> None:
        """Slot ``slot`` as a fresh sequence must find it."""
        ...

    def copy_tokens(self, src: int, dst: int, tokens: int) -> None:
        """Tokens ``0 .. tokens - 1`` of page ``src`` into page ``dst`` (a sequence resumed
        from a checkpoint gets a copy of the partial last page, and writes the rest)."""
        ...


class MemoryKind(Protocol):
    """What one layer keeps per sequence: its sizes, and its buffers made on demand."""

    def page_bytes(self, page_tokens: int, kv_dtype: str) -> int:
        """Bytes of one page of ``page_tokens`` tokens, values stored as ``kv_dtype``."""
        ...

    def slot_bytes(self) -> int:
        """Bytes of one slot's state (what snapshots and host copies take)."""
        ...

    def record_bytes(self, rows: int) -> int:
        """Bytes per slot of the record of a multi-row step of ``rows`` rows (1: single-row
        steps only, which need none)."""
        ...

    def allocate(
        self,
        xp: ModuleType,
        *,
        slots: int,
        pages: int,
        page_tokens: int,
        kv_dtype: str,
        record_rows: int,
    ) -> LayerMemory:
        """Zeroed buffers for ``slots`` slots and ``pages`` pages on array module ``xp``."""
        ...


class PagedKind:
    """A base for kinds kept in pages alone (keys and values, latents): nothing per slot, no
    record of multi-row steps. A subclass names its buffers' class as ``pages``, made from
    ``(spec, pages, page_tokens, xp, kv_dtype)``."""

    pages: ClassVar[Any]

    def slot_bytes(self) -> int:
        return 0

    def record_bytes(self, rows: int) -> int:
        return 0

    def allocate(
        self,
        xp: ModuleType,
        *,
        slots: int,
        pages: int,
        page_tokens: int,
        kv_dtype: str,
        record_rows: int,
    ) -> LayerMemory:
        return self.pages(self, pages, page_tokens, xp, kv_dtype)
