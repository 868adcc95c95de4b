"""Our attention kernels: a decode step's K/V stores and attention over the page table
(``backends/cuda/kernels/attention.cu``, capturable), and prefill attention
(``kernels/prefill_attention.cu``: a lane's K/V tiles read through its page ids straight from
the pool, in every prefill precision)."""

from __future__ import annotations

from typing import Any

import cupy as cp

from ...backends.cuda import attention
from ...backends.cuda import prefill_attention as pfa

__all__ = ["accepts", "accepts_decode", "accepts_step", "decode", "prefill", "write"]

_STORAGES = ("float32", "bf16", "e4m3")
#: the backend's prefill precision -> the kernel's (the scores split into two halves always:
#: their error grows with their size)
_PRECISION = {"bf16": "bf16", "tf32": "split_qk", "float32": "split"}


def accepts_step(*, device: str, head_dim: int, storage: str, **_: object) -> bool:
    """A decode step's K/V stores: their compiled head sizes, every storage."""
    return device == "cuda" and head_dim in attention.HEAD_DIMS and storage in _STORAGES


def accepts_decode(*, group: int = 1, **key: Any) -> bool:
    """Decode attention: as the stores, any group of query heads a kv head (more than the
    kernel's ``MAX_GROUP`` in equal shares, one launch each)."""
    return accepts_step(**key) and group >= 1


def accepts(*, device: str, head_dim: int, storage: str, **_: object) -> bool:
    """The prefill kernel: its compiled head sizes, every storage and precision."""
    return device == "cuda" and head_dim in pfa.HEAD_DIMS and storage in _STORAGES


def prefill(
    q: Any, k_pages: Any, v_pages: Any, pages: Any, *, start: int, scale: float, precision: str
) -> Any:
    return pfa.prefill_attention(
        pfa.kernel_input(q),
        k_pages,
        v_pages,
        cp.ascontiguousarray(pages, dtype=cp.int32),
        start=start,
        scale=scale,
        precision=_PRECISION[precision],
    )


def write(
    k_pages: Any, v_pages: Any, page_table: Any, slots: Any, positions: Any, k: Any, v: Any
) -> None:
    attention.kv_write(
        k_pages, v_pages, page_table, slots, positions, cp.ascontiguousarray(k),
        cp.ascontiguousarray(v),
    )  # fmt: skip


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
    return attention.attention_decode(
        cp.ascontiguousarray(q), k_pages, v_pages, page_table, slots, positions, scale
    )
