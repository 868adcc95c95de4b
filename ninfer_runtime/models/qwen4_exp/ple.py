"""Per-layer embeddings (PLE): hashed n-grams of the token history, added to every residual
stream of a Gated DeltaNet layer before its mixer connection.

    history = the last ngram_size-1 ids before the rows (the pad token before a sequence)
              then the rows' ids; an n-gram never reaches back across a pad (end-of-text)
              token: such a position reads as the pad token
    id_h    = (XOR_{j<n} token_{t-j} · m_j) mod size_h + offset_h     for order n = 2..ngram,
              heads_per_ngram heads each (primes, offsets and odd multipliers m_j from the
              format's ``qwen4_exp_ngram``)
    e       = [table[id_h] for every head]                   [T, E]
    key     = RMSNorm_1p per stream (key · e)                [T, hc, H]
    value   = value · e                                      [T, H]
    query   = RMSNorm_1p per stream (streams)                [T, hc, H]
    g       = Σ key ⊙ query / sqrt(H);  g = sign(g) sqrt(max(|g|, 1e-6))     per stream
    gated   = sigmoid(g) value                               [T, hc, H]
    out     = gated + silu(dilated depthwise conv of RMSNorm_1p per stream (gated))

The convolution has ``ple_conv_kernel_size`` taps spaced ``ngram_size`` rows apart; its
state is the last ``(taps - 1) · ngram_size`` inputs. Both states live in the layer's slot
(``memory.PleGdnSlots``).

A prompt's n-grams are hashed on the host (a few integer ops a row; a streamed table's reader
wants host row ids anyway): its ids and n-gram context are copied down, the table rows
gathered into backend arrays, and the rest runs on the backend's arrays. A decode step's (one
row a lane) are hashed from the lanes' contexts (``last_ngram_ids``): with a resident table
on the backend's arrays inside the step; with a streamed one on the host before it
(``staged_rows``, for the model's ``stage_decode``), its rows read and written where the
step reads them. Either way the step itself reads nothing back, so it may be captured.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ninfer_format.binders.qwen4_exp_parts import Ple

from ...arrays import array_module
from ...backends import Backend, Weight
from ...backends.base import to_numpy
from ...functional import sigmoid, silu
from ...row_cache import StreamedRows
from ..batch import Batch
from .hyper_connections import GroupNorm
from .memory import PleGdnSlots

Array = Any
#: the gate's magnitude floor before its square root (transformers' clamp)
GATE_FLOOR = 1e-6


def shifted(history: Array, shift: int, pad: int) -> Array:
    """``history[t - shift]`` for every t, or ``pad`` where that reaches before the history or
    across a pad token at ``t - shift .. t - 1`` (each text segment hashes on its own)."""
    xp = array_module(history)
    if shift == 0:
        return history
    t = xp.arange(history.shape[0])
    pads = xp.where(history == pad, t, -1)
    last_pad_before = xp.concatenate([xp.asarray([-1]), xp.maximum.accumulate(pads)[:-1]])
    source = t - shift
    valid = (source > last_pad_before) & (source >= 0)
    return xp.where(valid, history[xp.maximum(source, 0)], pad)


def ngram_ids(history: Array, ple: Ple, layer: int) -> Array:
    """Rows of the layer's n-gram table for every position of ``history`` (int64 ids) ->
    int64 [len(history), heads]: order 2's heads first, then order 3's, …"""
    xp = array_module(history)
    history = history.astype(xp.int64)
    multipliers = ple.multipliers(layer)
    sizes = xp.asarray(ple.head_vocab_sizes(layer), dtype=xp.int64)
    offsets = xp.asarray(ple.head_offsets(layer), dtype=xp.int64)
    tokens = [shifted(history, j, ple.pad_token) for j in range(ple.ngram_size)]
    mixed = tokens[0] * xp.int64(multipliers[0])
    blocks = []
    for order in range(2, ple.ngram_size + 1):
        mixed = mixed ^ (tokens[order - 1] * xp.int64(multipliers[order - 1]))
        heads = slice((order - 2) * ple.heads_per_ngram, (order - 1) * ple.heads_per_ngram)
        blocks.append(mixed[:, None] % sizes[heads] + offsets[heads])
    return xp.concatenate(blocks, axis=1)


def last_ngram_ids(history: Array, ple: Ple, layer: int, sizes: Array, offsets: Array) -> Array:
    """The table rows of the last position of each row of ``history`` [N, L] (a lane's
    n-gram context then its new id, on any array module) -> int64 [N, heads]: ``ngram_ids``
    of that position, each shifted token the pad token where it or a token after it (before
    the last) is one. ``sizes``, ``offsets``: the layer's head vocabulary sizes and offsets
    (int64, on the history's array module: made once, so a captured step copies nothing)."""
    xp = array_module(history)
    history = history.astype(xp.int64)
    pad, length = ple.pad_token, history.shape[1]
    multipliers = ple.multipliers(layer)
    mixed = history[:, -1] * xp.int64(multipliers[0])
    blocked = xp.zeros(history.shape[0], dtype=bool)
    blocks = []
    for order in range(2, ple.ngram_size + 1):
        shift = order - 1
        if shift < length:
            blocked = blocked | (history[:, length - 1 - shift] == pad)
            token = xp.where(blocked, xp.int64(pad), history[:, length - 1 - shift])
        else:  # before the history
            token = xp.full(history.shape[0], pad, dtype=xp.int64)
        mixed = mixed ^ (token * xp.int64(multipliers[shift]))
        heads = slice((order - 2) * ple.heads_per_ngram, (order - 1) * ple.heads_per_ngram)
        blocks.append(mixed[:, None] % sizes[heads] + offsets[heads])
    return xp.concatenate(blocks, axis=1)


def dilated_conv(x: Array, kernel: Array, state: Array, dilation: int) -> Array:
    """Depthwise causal convolution of x [..., T, C] with kernel [K, C], taps ``dilation``
    rows apart, continuing ``state`` (the last (K-1)·dilation inputs [..., R, C]) -> y
    [..., T, C]; leading axes are independent sequences (a decode step's lanes, one row
    each). The state is not touched (``PerLayerEmbedding._advance`` moves it on)."""
    xp = array_module(x)
    t = x.shape[-2]
    window = xp.concatenate([state, x], axis=-2)
    y = xp.zeros_like(x)
    for j in range(kernel.shape[0]):
        y += kernel[j] * window[..., j * dilation : j * dilation + t, :]
    return y


class PerLayerEmbedding:
    """The PLE block of decoder layer ``layer`` (``L ple/…`` parameters)."""

    def __init__(
        self,
        prefix: str,
        layer: int,
        ple: Ple,
        streams: int,
        eps: float,
        backend: Backend,
        weights: Mapping[str, Weight],
    ):
        p = prefix + "ple/"
        self.ple, self.layer, self.streams = ple, layer, streams
        self.backend = backend
        #: the n-gram table: a backend weight (resident) or ``StreamedRows`` read from disk
        self.table: Weight | StreamedRows = weights[p + "ngram_table"]
        self.key = weights[p + "key"]
        self.value = weights[p + "value"]
        self.key_norm, self.query_norm, self.convolution_norm = (
            GroupNorm(backend, backend.array(weights[p + name]), streams, eps)
            for name in ("key_norm", "query_norm", "convolution_norm")
        )
        self.convolution = backend.array(weights[p + "convolution"])  # [K, hc·H]
        #: the n-gram heads' vocabulary sizes and offsets, for a decode step's hash: on the
        #: backend (a resident table's step hashes there) and on the host (a streamed one's)
        sizes, offsets = ple.head_vocab_sizes(layer), ple.head_offsets(layer)
        self.host_heads = (np.asarray(sizes, np.int64), np.asarray(offsets, np.int64))
        self.head_sizes, self.head_offsets = (backend.xp.asarray(a) for a in self.host_heads)

    @staticmethod
    def parameter_names(prefix: str) -> list[str]:
        p = prefix + "ple/"
        names = ("ngram_table", "key", "value", "key_norm", "query_norm", "convolution_norm")
        return [p + s for s in (*names, "convolution")]

    def __call__(self, streams: Array, ids: Array, batch: Batch, memory: PleGdnSlots) -> Array:
        """What PLE adds to the streams [N, hc·H] of rows with token ids [N]; the lanes'
        states advance (a multi-row step records its rows for ``commit`` instead). Every
        lane's n-grams are hashed first, so the step's table rows are gathered in one pass
        (a streamed table reads all its missing rows at once), and the row by row part runs
        on every row at once; only the convolution, which continues each lane's state, goes
        lane by lane, and a decode step's (one row a lane) all lanes at once."""
        xp = self.backend.xp
        d = batch.decode
        dilation = self.ple.conv_dilation
        if d is not None and d.tokens == 1:  # every lane's one row, each lane's states its own
            at = d.slots
            if isinstance(self.table, StreamedRows):  # read before the step (``stage_decode``)
                e = memory.staged(self.ple.embed_dim)[: ids.shape[0]]
            else:
                history = xp.concatenate([memory.ple_context[at], ids[:, None].astype(xp.int32)], 1)
                table_rows = last_ngram_ids(
                    history, self.ple, self.layer, self.head_sizes, self.head_offsets
                )
                e = self.embeddings(table_rows)
            gated, inputs = self.gate(streams, e)
            rows = inputs[:, None, :]
            conv = dilated_conv(rows, self.convolution, memory.ple_conv[at], dilation)
            self._advance(memory, at, ids[:, None], rows)
            return gated + silu(conv[:, 0])
        if d is None:
            lanes = [(lane.rows, lane.state.slot, lane.marks) for lane in batch.lanes]
        else:
            t = d.tokens
            slots = d.host_slots[:: d.tokens]
            lanes = [(slice(i * t, (i + 1) * t), s, ()) for i, s in enumerate(slots)]
        host_ids = to_numpy(ids)
        contexts = to_numpy(memory.ple_context)  # every slot's in one read, not one a lane
        row_ids = [self.row_ids(host_ids[rows], contexts[slot]) for rows, slot, _ in lanes]
        gated, inputs = self.gate(streams, self.embeddings(np.concatenate(row_ids)))
        convs = []
        for rows, slot, marks in lanes:
            conv = dilated_conv(inputs[rows], self.convolution, memory.ple_conv[slot], dilation)
            convs.append(conv)
            if d is not None:  # a multi-row step: the states stay; commit folds in the kept rows
                record = memory.ple_record
                assert record is not None, "a multi-row step needs a pool with records"
                record.inputs[slot, : d.tokens] = inputs[rows]
                record.ids[slot, : d.tokens] = ids[rows]
            else:
                self._advance_through(memory, slot, ids[rows], inputs[rows], marks)
        return gated + silu(convs[0] if len(convs) == 1 else xp.concatenate(convs))

    def staged_rows(self, history: np.ndarray) -> np.ndarray:
        """A streamed table's rows [N, E] (host) for a decode step: the n-gram rows of the
        last position of each lane's ``history`` [N, L] (host: its n-gram context, then its
        new id), read through the table's cache."""
        table_rows = last_ngram_ids(history, self.ple, self.layer, *self.host_heads)
        assert isinstance(self.table, StreamedRows)
        rows = self.table.gather(table_rows.reshape(-1))
        return rows.reshape(history.shape[0], self.ple.embed_dim)

    def row_ids(self, ids: Array, context: Array) -> np.ndarray:
        """The table rows [T, heads] of T consecutive ids after the n-gram ``context`` (either
        on the host or the backend), hashed on the host."""
        history = np.concatenate([to_numpy(context), to_numpy(ids)]).astype(np.int64)
        return ngram_ids(history, self.ple, self.layer)[history.shape[0] - ids.shape[0] :]

    def embeddings(self, row_ids: Array) -> Array:
        """The n-gram embeddings [T, E] of table rows [T, heads] (host or backend ids): a
        resident table's rows gathered by the backend, a streamed table's read through its
        cache (host rows, moved to the backend once gathered)."""
        flat = row_ids.reshape(-1)
        if isinstance(self.table, StreamedRows):
            e = self.backend.xp.asarray(self.table.gather(to_numpy(flat)))
        else:
            e = self.backend.embedding(flat, self.table)
        return e.reshape(row_ids.shape[0], self.ple.embed_dim)

    def gate(self, streams: Array, e: Array) -> tuple[Array, Array]:
        """The row by row part of PLE, for rows of any lanes: streams [T, hc·H] and their
        n-gram embeddings ``e`` [T, E] -> (the gated values [T, hc·H], the convolution's
        inputs [T, hc·H])."""
        be, hc = self.backend, self.streams
        xp, t = be.xp, e.shape[0]
        key = self.key_norm(be.linear(e, self.key))
        value = be.linear(e, self.value)
        query = self.query_norm(streams)
        width = value.shape[-1]
        g = (key * query).reshape(t, hc, width).sum(axis=-1) / np.float32(np.sqrt(width))
        g = xp.sign(g) * xp.sqrt(xp.maximum(xp.abs(g), np.float32(GATE_FLOOR)))
        gated = (sigmoid(g)[:, :, None] * value[:, None, :]).reshape(t, hc * width)
        return gated, self.convolution_norm(gated)

    def commit(self, memory: PleGdnSlots, slots: Array, counts: Array) -> None:
        """After a multi-row step: fold each lane's first ``counts[i]`` recorded rows into the
        states of slot ``slots[i]``."""
        record = memory.ple_record
        assert record is not None
        for slot, count in zip(to_numpy(slots).tolist(), to_numpy(counts).tolist(), strict=True):
            if count:
                self._advance(memory, slot, record.ids[slot, :count], record.inputs[slot, :count])

    def _advance_through(
        self, memory: PleGdnSlots, slot: int, ids: Array, inputs: Array, marks: Any
    ) -> None:
        """Slot ``slot``'s states after a lane's rows, advanced piece by piece up to each of
        its marks (``batch.Mark``), where the PLE states are saved (the layer's Gated
        DeltaNet saves its own as it reads)."""
        at = 0
        for mark in marks:
            self._advance(memory, slot, ids[at : mark.row], inputs[at : mark.row])
            mark.save((memory.ple_conv, memory.ple_context))
            at = mark.row
        self._advance(memory, slot, ids[at:], inputs[at:])

    def _advance(self, memory: PleGdnSlots, slot: Any, ids: Array, inputs: Array) -> None:
        """Slot ``slot``'s states after rows with ``ids`` [T] and convolution ``inputs``
        [T, C]; or slots ``slot`` (an array) after theirs ([N, T], [N, T, C])."""
        xp = self.backend.xp
        kept, rows = memory.ple_context.shape[1], memory.ple_conv.shape[1]
        context = xp.concatenate([memory.ple_context[slot], ids.astype(xp.int32)], axis=-1)
        memory.ple_context[slot] = context[..., context.shape[-1] - kept :]
        window = xp.concatenate([memory.ple_conv[slot], inputs], axis=-2)
        memory.ple_conv[slot] = window[..., window.shape[-2] - rows :, :]
