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

    page_tokens = k_pages.shape[1]
    rows = key_rows(lanes, page_tokens)
    tokens = np.array([t for t, _, _ in lanes], dtype=np.int64)
    lengths = np.array([t + s for t, s, _ in lanes], dtype=np.int64)
    offsets = [np.concatenate([[0], np.cumsum(a)]).astype(np.int32) for a in (tokens, lengths)]
    with on_cupy_stream():
        cu_q, cu_k = (view(cp.asarray(a)) for a in offsets)

        def packed(pool: Array) -> Any:
            flat = pool.reshape(-1, *pool.shape[2:])  # [pages x P, Nkv, D]
            return sdpa.as_bf16(flat[rows], pool.dtype)  # one gather: every lane's rows

        out = torch.ops.aten._flash_attention_forward(
            view(q).to(torch.bfloat16),
            packed(k_pages),
            packed(v_pages),
            cu_q,
            cu_k,
            int(tokens.max()),
            int(lengths.max()),
            0.0,  # no dropout
            True,  # causal, aligned to each lane's last query
            False,
            scale=scale,
        )[0]
        result = out.to(torch.float32).contiguous()
    return cp.from_dlpack(result)
