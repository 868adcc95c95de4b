"""One sequence's memory in the context pool: its slot, its pages and how far it has read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .state import ContextPool

Array = Any


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
