"""Our MoE kernels (``backends/cuda/moe.py``, ``kernels/moe.cu``) as the ``block`` provider:
the dispatch between the capturable decode path, the grouped prefill path and the read-back
path of experts without an expert GEMV. Each layer's device tables
(``moe_experts.ExpertTable``) are built once and kept with the backend
(``backend.expert_tables``), which owns device memory, for as long as the layer's
``MoeWeights`` live (expert offload replaces a block's weights as experts come and go: the
tables of the old ones, and the experts those point at, must not stay)."""

from __future__ import annotations

import logging
import weakref
from typing import Any

import cupy as cp
import numpy as np

from ...backends.array_ops import count_pairs, sigmoid, softmax
from ...backends.base import MoeWeights
from ...backends.cuda import kernels, moe_routed, moe_routing
from ...backends.cuda import moe as moe_kernels
from . import reference
from .reference import expert

__all__ = ["MOE_DEVICE_ROWS", "accepts", "block", "expert_table", "route", "routed_experts"]

log = logging.getLogger("ninfer.cuda")

Array = Any

#: most rows ``block`` runs on the device (capturable) path: a speculative verification has
#: up to 8 lanes x (5 drafts + 1) = 48
MOE_DEVICE_ROWS = 64
#: ``routed_experts``' tables kept (the last used): a layer's experts change as expert
#: offload places and streams them, so tables of lists gone by must not pile up
ROUTED_TABLES = 256


def accepts(*, device: str, **_: object) -> bool:
    return device == "cuda"


def expert_table(backend: Any, weights: MoeWeights) -> Any:
    """The layer's ``moe_experts.ExpertTable`` on ``backend`` (None: its experts have no expert
    GEMV), built on first use and dropped with ``weights``."""
    tables, key = backend.expert_tables, id(weights)
    known = tables.get(key)
    if known is not None and known[0]() is weights:
        return known[1]
    try:
        table = moe_kernels.ExpertTable(weights, backend.join_rows)
    except moe_kernels.ExpertTableError as exc:
        log.info("MoE layer without the expert GEMV (%s): top-k read back", exc)
        table = None

    def forget(ref: weakref.ref) -> None:  # the weights are gone: so is their entry
        if tables.get(key, (None,))[0] is ref:
            del tables[key]

    tables[key] = (weakref.ref(weights, forget), table)
    return table


def block(backend: Any, x: Array, weights: MoeWeights) -> Array:
    """On the device when the experts have an expert GEMV (``moe_experts.ExpertTable``): up to
    ``MOE_DEVICE_ROWS`` rows (decode steps, speculative verifications) run
    ``moe.moe_decode`` (capturable) over chunks of at most ``MAX_GEMV_ROWS`` rows, more
    rows (prefill chunks) ``moe.moe_prefill``. Other experts: the top-k choice is read
    back (N x E floats) and each selected expert runs once over its rows; none held here
    (expert offload's host holds every routed expert of the layer): the shared expert alone,
    as their pairs add nothing, with nothing read back (so a decode step stays capturable)."""
    n, step, hits = x.shape[0], kernels.MAX_GEMV_ROWS, weights.hits
    table = expert_table(backend, weights) if n > 0 else None
    if table is not None and n > MOE_DEVICE_ROWS:
        return moe_kernels.moe_prefill(backend, x, table, hits)
    if table is not None:
        chunks = [
            moe_kernels.moe_decode(backend, x[a : a + step], table, hits) for a in range(0, n, step)
        ]
        return chunks[0] if len(chunks) == 1 else cp.concatenate(chunks)
    if all(ex is None for ex in weights.experts):  # (a table holds at least one)
        return _shared(backend, x, weights)
    probs = softmax(backend.linear(x, weights.router))
    # read back: the rows of each expert
    top, share = reference.route(cp.asnumpy(probs), weights.top_k)
    count_pairs(hits, cp.asarray(top))
    share = cp.asarray(share)
    out = cp.zeros_like(x)
    for e in np.unique(top):
        ex = weights.experts[int(e)]
        if ex is None:  # another rank's expert
            continue
        rows, slot = np.nonzero(top == e)
        rows_d, slot_d = cp.asarray(rows), cp.asarray(slot)
        y = expert(backend, x[rows_d], ex.gate, ex.up, ex.down)
        out[rows_d] += share[rows_d, slot_d, None] * y
    return out + _shared(backend, x, weights)


def _shared(backend: Any, x: Array, weights: MoeWeights) -> Array:
    """The shared expert scaled by its sigmoid score."""
    sh = weights.shared
    score = sigmoid(backend.linear(x, weights.shared_score))
    return score * expert(backend, x, sh.gate, sh.up, sh.down)


def route(probs: Array, top_k: int) -> tuple[Array, Array]:
    """``reference.route`` on the block's router kernel (``moe_routing.route``: no sort, nothing
    read back, so a step that routes here stays capturable; ids int32). The kernel takes
    logits and applies the softmax itself: given log(probs), it recovers probs (they sum to
    1), so the choice and the renormalised shares are the reference's to rounding, ties to
    the lower index alike. Past the kernel's sizes: the reference's."""
    if probs.shape[-1] > moe_routing.MAX_EXPERTS or not 0 < top_k <= moe_routing.MAX_TOP_K:
        return reference.route(probs, top_k)
    return moe_routing.route(cp.log(probs), top_k)


def routed_experts(
    backend: Any, x: Array, top: Array, weights: Array, experts: Any, *, out: Array
) -> None:
    """``reference.routed_experts`` on the expert GEMVs (``moe_routed``) for up to
    ``MOE_DEVICE_ROWS`` rows of experts a table can hold; more rows, or experts without an
    expert GEMV, take the reference's loop."""
    table = _routed_table(backend, experts) if 0 < x.shape[0] <= MOE_DEVICE_ROWS else None
    if table is None:
        reference.routed_experts(backend, x, top, weights, experts, out=out)
        return
    out += moe_routed.routed(x, table, top, weights)


def _routed_table(backend: Any, experts: Any) -> Any:
    """The ``RoutedTable`` of these experts (None: they have no expert GEMV), the last
    ``ROUTED_TABLES`` built kept with the backend, each checked to serve the same experts."""
    tables = backend.routed_tables
    key = id(experts)
    table = tables.get(key)
    if table is None or not table.serves(experts):
        try:
            table = moe_routed.RoutedTable(experts)
        except moe_kernels.ExpertTableError as exc:
            log.info("routed experts without the expert GEMV (%s): the reference's loop", exc)
            return None
        tables[key] = table
        while len(tables) > ROUTED_TABLES:
            tables.popitem(last=False)
    tables.move_to_end(key)
    return table
