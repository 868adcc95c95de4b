"""Which host experts keep decoded float32 copies (``[engine] host_expert_cache``): those
routing chooses most, within the allowance. A copy spares the reference's way its decoding
(``host_experts``); a packed expert takes none, as its kernel reads codes faster than
float32 values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .host_experts import HostExpert

__all__ = ["hold_by_layer", "hold_hottest"]


def hold_hottest(experts: Sequence[tuple[float, HostExpert]], allowance: int) -> int:
    """Keep decoded copies of the experts most chosen first (``(priority, expert)``; among
    equals, in the order given; packed experts take none) while their bytes fit
    ``allowance``; drop the others'. Returns the bytes held."""
    used = 0
    order = sorted(range(len(experts)), key=lambda i: -experts[i][0])
    keep = set()
    for i in order:
        if not experts[i][1].holds_copies:
            continue
        size = experts[i][1].decoded_bytes
        if used + size <= allowance:
            keep.add(i)
            used += size
    for i, (_, host_expert) in enumerate(experts):
        host_expert.hold(i in keep)
    return used


def hold_by_layer(
    blocks: Sequence[Any], counts: Mapping[int, Sequence[float]] | None, allowance: int
) -> int:
    """Decoded copies for the host experts of the split ``blocks`` most chosen (by
    ``counts``: layer -> hits per expert; None: all alike) within ``allowance``; among equals
    each layer's next expert in turn, so the layers' copies stay even, as the plan's
    residency does. Returns the bytes held."""
    candidates = []
    for b in blocks:
        hits = {e: float(counts[b.layer][e]) if counts is not None else 0.0 for e in b.host_experts}
        for rank, e in enumerate(sorted(hits, key=lambda e: (-hits[e], e))):
            candidates.append((rank, b.layer, hits[e], b.host_experts[e]))
    candidates.sort(key=lambda c: (c[0], c[1]))  # hold_hottest's sort by hits is stable
    return hold_hottest([(hits, expert) for _, _, hits, expert in candidates], allowance)
