"""The attention family's oracle, as array math (numpy or CuPy): a prefill chunk's rows gathered
from the pages, decoded to float32 and attended causally (``array_ops.attention_pages``), a
decode step's rows over the page table (``attention_decode``) and its K/V stores
(``kv_write``)."""

from __future__ import annotations

from typing import Any

from ...backends.array_ops import attention_decode, attention_pages
from ...backends.array_ops import kv_write as write

__all__ = ["TOLERANCE", "accepts", "decode", "prefill", "write"]

#: provider -> (rtol, atol as a fraction of the largest reference value) of ``prefill`` and
#: ``prefill_lanes`` in bf16 products against this oracle (scores to about 16 bits, P and V
#: rounded to bf16: the bound tests/gpu/test_prefill_attention.py holds our kernel to)
TOLERANCE: dict[str, tuple[float, float]] = {
    "reference": (1e-5, 1e-6),
    "nvrtc": (0.0, 6e-3),
    "sdpa": (0.0, 6e-3),
    "varlen": (0.0, 6e-3),
    "each": (0.0, 6e-3),  # its ``one_lane``'s: at most the loosest above
}


def accepts(**_: object) -> bool:
    return True


def prefill(
    q: Any, k_pages: Any, v_pages: Any, pages: Any, *, start: int, scale: float, **_: Any
) -> Any:
    return attention_pages(q, k_pages, v_pages, pages, start=start, scale=scale)


def decode(
    q: Any,
    k_pages: Any,
    v_pages: Any,
    page_table: Any,
    slots: Any,
    positions: Any,
    *,
    scale: float,
) -> Any:
    return attention_decode(q, k_pages, v_pages, page_table, slots, positions, scale)
