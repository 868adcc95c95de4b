"""The device side of one draft-and-verify pass (``ModelRunner.speculate``), as one step.

Everything here runs on the device with no host synchronisation, so the runner compiles it
once per lane count and draft length: the MTP block writes the entries of the tokens the
last round accepted, drafts K tokens per lane from the pending token (its most likely token
each time), and the main model verifies pending + drafts, K+1 rows per lane, recording the
rows in the recurrent layers without changing their states (``ModelRunner.commit`` folds in
the accepted prefix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .models.base import Model
from .models.batch import Batch, DecodeIndex
from .state import ContextPool

Array = Any


@dataclass(frozen=True)
class Proposal:
    """One ``speculate`` pass: per lane the K drafted tokens (host int [lanes, K]), the main
    model's argmax at each of the K+1 verified positions (host int [lanes, K+1]; row j
    follows the pending token and drafts 1..j), and the verified logits (device
    [lanes * (K+1), V], lane-major) for requests that sample."""

    drafts: np.ndarray
    targets: np.ndarray
    logits: Array


def speculate_rows(
    model: Model,
    pool: ContextPool,
    t: int,
    optimized_head: bool,
    slots: Array,
    lengths: Array,
    starts: Array,
    last: Array,
    carry: Array,
    deltas: Array | None = None,
) -> tuple[Array, Array]:
    """-> (int32 [n, K + t] drafts then argmax targets, logits [n * t, V]) for ``t`` = K+1
    rows per lane. ``deltas``: each lane's ``rope_delta``, added to every RoPE position of
    its drafter and verification rows (the cache is still addressed by sequence index)."""
    xp, n = model.backend.xp, slots.shape[0]
    cos, sin = model.rope_table(pool.max_context + 1) or (None, None)
    steps = xp.arange(t, dtype=xp.int32)

    def shift(at: Array, per_row: bool = True) -> Array:
        """RoPE positions of sequence indices ``at`` (one a lane, or ``t`` a lane)."""
        if deltas is None:  # text only: the positions are the indices
            return at
        return at + (xp.repeat(deltas, t) if per_row else deltas)

    def rows(slot: Array, position: Array, rope_at: Array, tokens: int = 1) -> Batch:
        index = DecodeIndex(slot, position, pool.page_table, tokens)
        if cos is None:
            return Batch((), None, None, index)
        return Batch((), cos[rope_at], sin[rope_at], index)

    # the MTP entries of the carried rows (pad rows past them are overwritten later)
    row_slots = xp.repeat(slots, t)
    entries = (starts[:, None] + steps[None, :]).reshape(-1)
    hidden = pool.draft_hidden[slots].reshape(n * t, -1)
    x = model.mtp_hidden(
        hidden,
        carry.reshape(-1),
        rows(row_slots, entries, shift(entries + 1), t),
        pool.mtp,
    )
    pick = xp.arange(n, dtype=xp.int32) * t + last
    x, entry = x[pick], starts + last
    pending = carry.reshape(-1)[pick]
    drafts = []
    for i in range(t - 1):
        drafts.append(model.propose(x, optimized=optimized_head))
        if i + 2 < t:
            entry = entry + 1
            at = shift(entry + 1, per_row=False)
            x = model.mtp_hidden(x, drafts[-1], rows(slots, entry, at), pool.mtp)
    drafted = xp.stack(drafts, axis=1).astype(xp.int32)  # [n, K]

    ids = xp.concatenate([pending[:, None].astype(xp.int32), drafted], axis=1).reshape(-1)
    positions = (lengths[:, None] + steps[None, :]).reshape(-1)
    h = model.hidden_states(ids, rows(row_slots, positions, shift(positions), t), pool)
    pool.draft_hidden[slots] = h.reshape(n, t, -1)
    logits = model.logits(h)
    targets = xp.argmax(logits, axis=-1).astype(xp.int32).reshape(n, t)
    return xp.concatenate([drafted, targets], axis=1), logits
