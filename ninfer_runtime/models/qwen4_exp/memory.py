"""The memory kinds Qwen4Exp adds (``memory_kinds``): what its PLE and QSA layers keep per
sequence, beside what Gated DeltaNet and attention already keep.

* A GDN layer with per-layer embeddings (``PleGdnSpec``) keeps, in its slot, the Gated
  DeltaNet states and PLE's own: the last ``(K-1)·dilation`` inputs of the dilated
  convolution ``[rows, hc·H]`` and the n-gram context, the last ``ngram_size - 1`` token ids
  (a fresh sequence reads as preceded by the pad token, transformers' EOS). Both are slot
  parts, so checkpoints, host copies and resumption carry them like the recurrent state.
* An attention layer with the QSA indexer (``IndexedKvSpec``) keeps, per page, the raw index
  key of every token ``[P, d]`` float32 beside its K/V, and each token's RoPE angles as cos
  and sin halves ``[P, rd]`` float32, since a block's key rotates at its first token's
  position, which after an image is that token's M-RoPE position (three streams), not its
  index; and each compressed block's key (``ops/attention/pooled_keys.py``: one a block of
  ``compress_ratio`` tokens), which the layer makes from its tokens' whenever one of them is
  written, so a query scores the blocks' keys without reading every token's.

These live with the model because neither has an op family of its own yet; they move there
when PLE and QSA get device kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ...arrays import array_module
from ...memory_kinds import PagedKind
from ...ops.attention.memory import AttentionPages, KvSpec
from ...ops.attention.pooled_keys import PooledKeys, pools_a_page
from ...ops.delta_rule.memory import GdnSlots, GdnSpec

if TYPE_CHECKING:
    from ...state import SequenceState

Array = Any


@dataclass(frozen=True)
class PleState:
    """PLE's per-sequence state: ``conv_rows`` inputs of ``channels`` and ``context`` ids."""

    channels: int  # hc·H
    conv_rows: int  # (ple_conv_kernel_size - 1) · dilation
    context: int  # ngram_size - 1
    pad_token: int

    def slot_bytes(self) -> int:
        return 4 * (self.conv_rows * self.channels + self.context)

    def record_bytes(self, rows: int) -> int:
        return 4 * rows * (self.channels + 1) if rows > 1 else 0


@dataclass(frozen=True)
class PleGdnSpec:
    """A Gated DeltaNet layer with per-layer embeddings: both states in one slot."""

    gdn: GdnSpec
    ple: PleState

    def page_bytes(self, page_tokens: int, kv_dtype: str) -> int:
        return 0

    def slot_bytes(self) -> int:
        return self.gdn.slot_bytes() + self.ple.slot_bytes()

    def record_bytes(self, rows: int) -> int:
        return self.gdn.record_bytes(rows) + self.ple.record_bytes(rows)

    def allocate(
        self,
        xp: ModuleType,
        *,
        slots: int,
        pages: int,
        page_tokens: int,
        kv_dtype: str,
        record_rows: int,
    ) -> PleGdnSlots:
        return PleGdnSlots(self, slots, xp, record_rows)


class PleRecord:
    """The rows of a multi-row step (a verification, a short chunk), kept for ``commit``:
    each lane's convolution inputs ``[slots, rows, hc·H]`` and token ids ``[slots, rows]``."""

    def __init__(self, spec: PleState, slots: int, rows: int, xp: ModuleType):
        self.inputs = xp.zeros((slots, rows, spec.channels), xp.float32)
        self.ids = xp.zeros((slots, rows), xp.int32)


class PleGdnSlots(GdnSlots):
    """``GdnSlots`` plus ``ple_conv [slots, conv_rows, hc·H]`` float32 and ``ple_context
    [slots, ngram_size - 1]`` int32 (and ``ple_record`` for pools running multi-row steps)."""

    def __init__(self, spec: PleGdnSpec, slots: int, xp: ModuleType, record_rows: int = 1):
        super().__init__(spec.gdn, slots, xp, record_rows)
        p = self.ple = spec.ple
        self.ple_conv = xp.zeros((slots, p.conv_rows, p.channels), xp.float32)
        self.ple_context = xp.full((slots, p.context), p.pad_token, xp.int32)
        self.ple_record = PleRecord(p, slots, record_rows, xp) if record_rows > 1 else None
        self._xp, self._staged = xp, None

    def staged(self, width: int) -> Array:
        """``[slots, width]`` float32: a decode step's n-gram embeddings, lane i's in row i,
        which the host writes before the step when the tables are streamed (scratch, not a
        state: never saved; made at the first step, outside any capture, so a captured step
        reads it at one address)."""
        if self._staged is None:
            slots = self.ple_context.shape[0]
            self._staged = self._xp.zeros((slots, width), self._xp.float32)
        return self._staged

    def slot_parts(self) -> Sequence[Array]:
        return (*super().slot_parts(), self.ple_conv, self.ple_context)

    def reset(self, slot: int) -> None:
        super().reset(slot)
        self.ple_conv[slot] = 0
        self.ple_context[slot] = self.ple.pad_token


class IndexedAttentionPages(AttentionPages):
    """``AttentionPages`` plus ``index_k [pages, page_tokens, d]`` float32, the indexer's raw
    key of every token (before its norm and RoPE, which apply to block means),
    ``index_rope [pages, page_tokens, rd]`` float32, the token's RoPE rows as halves: the
    first ``rd / 2`` values of its cos row, then of its sin row (each row repeats its half),
    and ``blocks``, the compressed blocks' keys."""

    def __init__(
        self, spec: IndexedKvSpec, pages: int, page_tokens: int, xp: ModuleType, kv_dtype: str
    ):
        super().__init__(spec.kv, pages, page_tokens, xp, kv_dtype)
        self.index_k = xp.zeros((pages, page_tokens, spec.index_dim), xp.float32)
        self.index_rope = xp.zeros((pages, page_tokens, spec.rotary_dim), xp.float32)
        self.blocks = PooledKeys(pages, page_tokens, spec.compress_ratio, spec.index_dim, xp)

    def write_index(
        self, state: SequenceState, start: int, keys: Array, cos: Array, sin: Array
    ) -> None:
        """Index keys [T, d] and RoPE rows (cos, sin [T, rd]) of tokens ``start .. start +
        T - 1`` of one sequence."""
        page, row = state.addresses(start, keys.shape[0])
        self.index_k[page, row] = keys
        self.index_rope[page, row] = rope_halves(cos, sin)

    def block_records(self, page_ids: Array, blocks: Array) -> tuple[Array, Array]:
        """The raw index keys [K, ratio, d] and RoPE halves [K, ratio, rd] of the tokens of
        ``blocks`` (as ``PooledKeys.tokens_of`` addresses them), which their keys are made
        from."""
        at = self.blocks.tokens_of(page_ids, blocks)
        return self.index_k[at], self.index_rope[at]

    def page_parts(self) -> Sequence[Array]:
        return (*super().page_parts(), self.index_k, self.index_rope, self.blocks.keys)

    def copy_tokens(self, src: int, dst: int, tokens: int) -> None:
        super().copy_tokens(src, dst, tokens)
        self.index_k[dst, :tokens] = self.index_k[src, :tokens]
        self.index_rope[dst, :tokens] = self.index_rope[src, :tokens]
        self.blocks.copy(src, dst)


def rope_halves(cos: Array, sin: Array) -> Array:
    """RoPE rows cos, sin [T, rd] -> what ``index_rope`` keeps of them [T, rd]."""
    half = cos.shape[-1] // 2
    return array_module(cos).concatenate([cos[:, :half], sin[:, :half]], axis=-1)


def rope_rows(halves: Array) -> tuple[Array, Array]:
    """``index_rope`` rows [..., T, rd] -> the RoPE rows cos, sin [..., T, rd] they were
    kept from."""
    xp, half = array_module(halves), halves.shape[-1] // 2
    cos, sin = halves[..., :half], halves[..., half:]
    return xp.concatenate([cos, cos], axis=-1), xp.concatenate([sin, sin], axis=-1)


@dataclass(frozen=True)
class IndexedKvSpec(PagedKind):
    """An attention layer with the QSA indexer: K/V as ``KvSpec``, plus per token one float32
    index key of ``index_dim`` and its RoPE halves (``rotary_dim`` float32), and per block of
    ``compress_ratio`` tokens one float32 key of ``index_dim``."""

    pages = IndexedAttentionPages

    kv: KvSpec
    index_dim: int
    rotary_dim: int
    compress_ratio: int

    def page_bytes(self, page_tokens: int, kv_dtype: str) -> int:
        extra = 4 * page_tokens * (self.index_dim + self.rotary_dim)
        blocks = 4 * self.index_dim * pools_a_page(page_tokens, self.compress_ratio)
        return self.kv.page_bytes(page_tokens, kv_dtype) + extra + blocks
