"""``prefill_lanes`` lane by lane: each lane's rows through the ``prefill`` op the layer
resolved (``one_lane``), stacked in row order. Every device takes it; on the CPU it is the
family's oracle of ``prefill_lanes``, with the reference's ``prefill`` as ``one_lane``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...arrays import array_module

__all__ = ["accepts", "prefill_lanes"]

Array = Any


def accepts(**_: object) -> bool:
    return True


def prefill_lanes(
    q: Array,
    k_pages: Array,
    v_pages: Array,
    lanes: Sequence[tuple[int, int, Any]],
    *,
    scale: float,
    precision: str,
    one_lane: Callable[..., Array],
) -> Array:
    """Lane i's ``tokens`` rows of q (the lanes' rows in order) through ``one_lane``."""
    outs, at = [], 0
    for tokens, start, pages in lanes:
        rows = q[at : at + tokens]
        outs.append(
            one_lane(rows, k_pages, v_pages, pages, start=start, scale=scale, precision=precision)
        )
        at += tokens
    return outs[0] if len(outs) == 1 else array_module(q).concatenate(outs)
