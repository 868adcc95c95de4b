"""Per-request state: everything a sequence carries from one forward call to the next.

Qwen3.5 is hybrid, so a sequence's memory has two kinds of layers: full-attention layers keep
a K/V cache that grows with the context, Gated DeltaNet layers keep a fixed-size recurrent
matrix per value head plus the last few convolution inputs. Both are preallocated here with
explicit shapes, so the engine knows a request's footprint up front and a GPU backend can keep
the buffers resident.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .errors import EngineError

Array = Any


@dataclass(frozen=True)
class KvSpec:
    """A full-attention layer: keys and values per cache slot, after k_norm and RoPE."""

    kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class GdnSpec:
    """A Gated DeltaNet layer: fp32 state [Hv, dk, dv] and the last K-1 conv inputs."""

    value_heads: int
    key_dim: int
    value_dim: int
    conv_channels: int
    conv_kernel: int


@dataclass
class KvCache:
    k: Array  # [max_context, Nkv, D] float32
    v: Array  # [max_context, Nkv, D] float32


@dataclass
class GdnState:
    recurrent: Array  # [Hv, dk, dv] float32, k-major like HF's cache
    conv: Array  # [conv_dim, K-1] float32, pre-convolution inputs, oldest first


LayerState = KvCache | GdnState


@dataclass
class SequenceState:
    """The memory of one sequence.

    ``length`` tokens have been consumed by the main model (their K/V are in slots
    ``0 .. length-1`` and their effect is folded into the GDN states). ``mtp`` is the MTP
    layer's own K/V cache: slot j holds the entry built from hidden state j and token j+1;
    ``mtp_length`` counts those entries.
    """

    max_context: int
    layers: list[LayerState]
    mtp: KvCache | None = None
    length: int = 0
    mtp_length: int = 0

    @classmethod
    def allocate(
        cls,
        specs: Sequence[KvSpec | GdnSpec],
        max_context: int,
        xp: ModuleType,
        *,
        mtp: KvSpec | None = None,
    ) -> SequenceState:
        if max_context <= 0:
            raise EngineError(f"max_context must be positive, got {max_context}")
        layers: list[LayerState] = [_allocate(s, max_context, xp) for s in specs]
        mtp_cache = _allocate(mtp, max_context, xp) if mtp is not None else None
        assert mtp_cache is None or isinstance(mtp_cache, KvCache)
        return cls(max_context, layers, mtp_cache)

    @property
    def free(self) -> int:
        """Tokens the main model can still take before the K/V caches are full."""
        return self.max_context - self.length

    def reset(self) -> None:
        """Forget the sequence (zero the recurrent parts; K/V slots are simply overwritten)."""
        self.length = 0
        self.mtp_length = 0
        for layer in self.layers:
            if isinstance(layer, GdnState):
                layer.recurrent[...] = 0
                layer.conv[...] = 0

    def nbytes(self) -> int:
        """Bytes held by the buffers (the request's memory footprint)."""
        total = 0
        for layer in [*self.layers, *([self.mtp] if self.mtp is not None else [])]:
            if isinstance(layer, KvCache):
                total += layer.k.nbytes + layer.v.nbytes
            else:
                total += layer.recurrent.nbytes + layer.conv.nbytes
        return int(total)


def _allocate(spec: KvSpec | GdnSpec, max_context: int, xp: ModuleType) -> LayerState:
    f32 = xp.float32
    if isinstance(spec, KvSpec):
        shape = (max_context, spec.kv_heads, spec.head_dim)
        return KvCache(xp.zeros(shape, f32), xp.zeros(shape, f32))
    return GdnState(
        xp.zeros((spec.value_heads, spec.key_dim, spec.value_dim), f32),
        xp.zeros((spec.conv_channels, spec.conv_kernel - 1), f32),
    )
