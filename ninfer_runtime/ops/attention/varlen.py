"""``prefill_lanes`` on torch's fused variable-length flash attention: every lane's queries of
a packed prefill step in one call a layer, where ``sdpa`` makes one call (and one gather) a
lane. Each lane's first ``start + tokens`` keys and values are gathered from its pages into one
packed bf16 K/V (one gather over every lane's rows), the queries rounded to bf16, and
``aten._flash_attention_forward`` runs with the lanes' cumulative query and key offsets, causal
(the flash kernel aligns the mask to each lane's last query, as ``causal_lower_right`` does for
``sdpa``) and grouped query heads as the kernel takes them. Products in bf16 with float32
accumulation: the production precision, so it declines the split-precision modes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..torch_interop import on_cupy_stream, view
from . import sdpa

__all__ = ["accepts", "prefill_lanes"]

Array = Any


def accepts(**key: Any) -> bool:
    """``sdpa``'s keys, where torch's flash kernel is available."""
    if not sdpa.accepts(**key):
        return False
    import torch

    return bool(torch.backends.cuda.is_flash_attention_available())


def key_rows(lanes: Sequence[tuple[int, int, Any]], page_tokens: int) -> Any:
    """The pool rows (page id x ``page_tokens`` + offset) of each lane's first ``start +
    tokens`` keys, lane after lane: int64 on the device, looked up there in the lanes' page
    ids (rows of the page table, all of one width), so only positions go up."""
    import cupy as cp

    lengths = [tokens + start for tokens, start, _ in lanes]
    positions = np.concatenate([np.arange(n) for n in lengths])
    lane_of = np.repeat(np.arange(len(lanes)), lengths)
    where = cp.asarray(np.stack([lane_of, positions // page_tokens, positions % page_tokens]))
    table = cp.stack([cp.asarray(pages) for _, _, pages in lanes])  # [lanes, max pages]
    return table[where[0], where[1]].astype(cp.int64) * page_tokens + where[2]


@dataclass(frozen=True)
class Packing:
    """What one step's lanes make of the packed call, the same in every attention layer:
    the key rows to gather (``key_rows``), the cumulative query and key offsets (int32 on
    the device) and the longest lane's queries and keys."""

    rows: Any
    cu_q: Any
    cu_k: Any
    max_q: int
    max_k: int

    @classmethod
    def of(cls, lanes: Sequence[tuple[int, int, Any]], page_tokens: int) -> Packing:
        import cupy as cp

        tokens = np.array([t for t, _, _ in lanes], dtype=np.int64)
        lengths = np.array([t + s for t, s, _ in lanes], dtype=np.int64)
        cu_q, cu_k = (
            cp.asarray(np.concatenate([[0], np.cumsum(a)]).astype(np.int32))
            for a in (tokens, lengths)
        )
        rows = key_rows(lanes, page_tokens)
        return cls(rows, cu_q, cu_k, int(tokens.max()), int(lengths.max()))


#: the last step's lanes (the same tuple object for every layer of a forward:
#: ``Batch.page_lanes``) and their packing, so its uploads are made once a step, not once a
#: layer; one entry, read and replaced whole
_last: tuple[Any, int, Packing] | None = None


def packing(lanes: Sequence[tuple[int, int, Any]], page_tokens: int) -> Packing:
    """``Packing.of(lanes, page_tokens)``, kept for the next call with the same lanes."""
    global _last
    last = _last
    if last is not None and last[0] is lanes and last[1] == page_tokens:
        return last[2]
    made = Packing.of(lanes, page_tokens)
    _last = (lanes, page_tokens, made)
    return made


def prefill_lanes(
    q: Array,
    k_pages: Array,
    v_pages: Array,
    lanes: Sequence[tuple[int, int, Any]],
    *,
    scale: float,
    **_: Any,
) -> Array:
    """q [N, Nq, D] float32 (the lanes' rows in order) -> [N, Nq, D] float32 (as
    ``lanes.prefill_lanes``)."""
    import cupy as cp
    import torch

    with on_cupy_stream():
        pack = packing(lanes, k_pages.shape[1])

        def packed(pool: Array) -> Any:
            flat = pool.reshape(-1, *pool.shape[2:])  # [pages x P, Nkv, D]
            return sdpa.as_bf16(flat[pack.rows], pool.dtype)  # one gather: every lane's rows

        out = torch.ops.aten._flash_attention_forward(
            view(q).to(torch.bfloat16),
            packed(k_pages),
            packed(v_pages),
            view(pack.cu_q),
            view(pack.cu_k),
            pack.max_q,
            pack.max_k,
            0.0,  # no dropout
            True,  # causal, aligned to each lane's last query
            False,
            scale=scale,
        )[0]
        result = out.to(torch.float32).contiguous()
    return cp.from_dlpack(result)
