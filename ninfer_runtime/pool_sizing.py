"""How big a context pool is: bytes per page and per slot, and the pages a byte budget buys.

Sizes are worked out from the memory kinds alone, before anything is allocated, so a
``--vram-budget`` can plan the experts beside the pool (``planned_bytes``) and
``ContextPool.for_budget`` allocates exactly what was planned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import EngineError
from .memory_kinds import MemoryKind
from .sizes import format_size

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


def with_mtp(specs: Sequence[MemoryKind], mtp: MemoryKind | None) -> list[MemoryKind]:
    """The memory kinds of the layers ``specs`` and of the MTP layer, if any."""
    return [*specs, *([mtp] if mtp is not None else [])]


def record_rows(draft: DraftSpec | None, step_rows: int) -> int:
    """Rows per lane the layers record for a multi-row step: the most of a compiled
    step's and a speculative round's."""
    return max(step_rows, draft.rows if draft else 1)


def page_bytes_of(
    specs: Sequence[MemoryKind],
    mtp: MemoryKind | None,
    tokens: int,
    kv_dtype: str = "float32",
) -> int:
    """Bytes of one page of ``tokens`` tokens across the layers and the MTP layer."""
    return sum(kind.page_bytes(tokens, kv_dtype) for kind in with_mtp(specs, mtp))


def slot_bytes_of(
    specs: Sequence[MemoryKind], draft: DraftSpec | None = None, step_rows: int = 1
) -> int:
    """Bytes of one slot: the states of the layers ``specs`` (the MTP layer's too, where
    it keeps any), their records of a multi-row step, and a speculative round's hidden
    rows."""
    rows = record_rows(draft, step_rows)
    size = sum(kind.slot_bytes() + kind.record_bytes(rows) for kind in specs)
    if draft is not None:
        size += draft.rows * 4 * draft.hidden
    return size


def planned_pages(
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
    """The pages ``ContextPool.for_budget`` gives a pool of these arguments."""
    if lanes <= 0 or max_context <= 0 or page_tokens <= 0:
        raise EngineError("a context pool needs positive slots, max_context and page_tokens")
    page_bytes = page_bytes_of(specs, mtp, page_tokens, kv_dtype)
    kinds = with_mtp(specs, mtp)
    pages = lanes * math.ceil(max_context / page_tokens)
    if snapshots and page_bytes:
        pages += snapshots * math.ceil(slot_bytes_of(kinds) / page_bytes)
    if budget is not None:
        slot_bytes = lanes * slot_bytes_of(kinds, draft, step_rows)
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


def planned_bytes(specs: Sequence[MemoryKind], **plan: Any) -> int:
    """The bytes ``ContextPool.for_budget(specs, xp, **plan)`` would allocate (its
    ``nbytes``), known before anything is: what a ``--vram-budget`` plans the experts beside."""
    pages = planned_pages(specs, **plan)
    mtp, draft = plan.get("mtp"), plan.get("draft")
    slot = slot_bytes_of(with_mtp(specs, mtp), draft, plan.get("step_rows", 1))
    page = page_bytes_of(
        specs, mtp, plan.get("page_tokens", PAGE_TOKENS), plan.get("kv_dtype", "float32")
    )
    return plan["lanes"] * slot + pages * page
