"""The memory kind of Gated DeltaNet layers (and of KDA layers, the per-channel-decay variant):
recurrent and convolution states in slots.

Each layer keeps, per slot, the fp32 recurrent state ``[Hv, dk, dv]`` and the last K-1 inputs
of its causal convolution ``[C, K-1]``; nothing per page. A pool that runs multi-row steps (a
speculative verification, a prompt's short chunk) also keeps each slot's record of the last
one (``GdnDrafts``), which the ``verify`` and ``commit`` ops write and fold in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

Array = Any


@dataclass(frozen=True)
class GdnSpec:
    """A Gated DeltaNet layer: fp32 state [Hv, dk, dv] and the last K-1 conv inputs.
    ``channel_decay``: the decay is one per key channel (KDA), so a multi-row step records
    a log-decay [Hv, dk] a row instead of one a head."""

    value_heads: int
    key_dim: int
    value_dim: int
    conv_channels: int
    conv_kernel: int
    channel_decay: bool = False

    @property
    def decay_shape(self) -> tuple[int, ...]:
        """One row's log-decay g: [Hv], or [Hv, dk] with ``channel_decay``."""
        return (self.value_heads, self.key_dim) if self.channel_decay else (self.value_heads,)

    def page_bytes(self, page_tokens: int, kv_dtype: str) -> int:
        return 0

    def slot_bytes(self) -> int:
        recurrent = self.value_heads * self.key_dim * self.value_dim
        return 4 * (recurrent + self.conv_channels * (self.conv_kernel - 1))

    def record_bytes(self, rows: int) -> int:
        return rows * GdnDrafts.bytes_per_row(self) if rows > 1 else 0

    def allocate(
        self,
        xp: ModuleType,
        *,
        slots: int,
        pages: int,
        page_tokens: int,
        kv_dtype: str,
        record_rows: int,
    ) -> GdnSlots:
        return GdnSlots(self, slots, xp, record_rows)


class GdnDrafts:
    """One GDN layer's record of a multi-row step (a verification, a prompt's short chunk):
    each lane's rows of projected conv inputs ``mixed [slots, rows, C]``, ``g``
    ``[slots, rows, *decay_shape]`` and ``beta`` ``[slots, rows, Hv]`` (the ``verify`` op
    writes them, ``commit`` folds the kept ones into the states)."""

    def __init__(self, spec: GdnSpec, slots: int, rows: int, xp: ModuleType):
        self.mixed = xp.zeros((slots, rows, spec.conv_channels), xp.float32)
        self.g = xp.zeros((slots, rows, *spec.decay_shape), xp.float32)
        self.beta = xp.zeros((slots, rows, spec.value_heads), xp.float32)

    @staticmethod
    def bytes_per_row(spec: GdnSpec) -> int:
        decay = spec.value_heads * (spec.key_dim if spec.channel_decay else 1)
        return 4 * (spec.conv_channels + decay + spec.value_heads)


class GdnSlots:
    """One GDN layer's states: ``recurrent [slots, Hv, dk, dv]``, ``conv [slots, C, K-1]``,
    and for pools that run multi-row steps the record of the last one (``drafts``)."""

    def __init__(self, spec: GdnSpec, slots: int, xp: ModuleType, record_rows: int = 1):
        s = spec
        self.recurrent = xp.zeros((slots, s.value_heads, s.key_dim, s.value_dim), xp.float32)
        self.conv = xp.zeros((slots, s.conv_channels, s.conv_kernel - 1), xp.float32)
        self.drafts = GdnDrafts(s, slots, record_rows, xp) if record_rows > 1 else None

    # ------------------------------------------------------------ the pool's interface
    def page_parts(self) -> Sequence[Array]:
        return ()

    def slot_parts(self) -> Sequence[Array]:
        """The states a snapshot and a host copy take (the record is only a step's)."""
        return (self.recurrent, self.conv)

    def reset(self, slot: int) -> None:
        self.recurrent[slot] = 0
        self.conv[slot] = 0

    def copy_tokens(self, src: int, dst: int, tokens: int) -> None:
        """Nothing is kept per page."""
