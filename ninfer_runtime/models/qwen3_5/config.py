"""The geometry of a Qwen3.5 / Qwen3.6 text model, as the model code reads it.

The text config is read by the format's one Qwen3.5 geometry (``qwen3_5_geometry``), the same
reading the binder checks artifacts with; this only adds what the runtime keeps beside it
(the routed experts a rank holds) and turns a bad config into a ``ModelError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ninfer_format.binders.qwen3_5_geometry import (
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    Attention,
    Gdn,
    GeometryError,
    Moe,
    Qwen35Geometry,
)

from ...errors import ModelError

__all__ = [
    "FULL_ATTENTION",
    "LINEAR_ATTENTION",
    "AttentionConfig",
    "GdnConfig",
    "MoeConfig",
    "Qwen35Config",
]

#: the format's records, under the names the model code uses
AttentionConfig = Attention
GdnConfig = Gdn


@dataclass(frozen=True)
class MoeConfig(Moe):
    #: the routed experts this rank holds, ``[first, stop)`` (expert parallelism); None: all
    owned: tuple[int, int] | None = None

    @property
    def held(self) -> range:
        return range(*self.owned) if self.owned else range(self.experts)


@dataclass(frozen=True)
class Qwen35Config:
    hidden: int
    vocab: int
    eps: float
    layer_types: tuple[str, ...]
    attention: AttentionConfig | None
    gdn: GdnConfig | None
    moe: MoeConfig | None  # None: dense MLP in every layer

    @classmethod
    def from_text_config(cls, c: Mapping[str, Any]) -> Qwen35Config:
        # Which components the artifact has is not known here: a config that spells out
        # attention members is read with them, as the MTP block (a full-attention block)
        # needs them; the model refuses MTP without attention itself.
        try:
            with_attention = "num_attention_heads" in c
            return cls.from_geometry(Qwen35Geometry.from_config(c, with_mtp=with_attention))
        except GeometryError as exc:
            raise ModelError(
                f"text config cannot define a Qwen3.5 model: {'; '.join(exc.problems)}"
            ) from None

    @classmethod
    def from_geometry(cls, g: Qwen35Geometry) -> Qwen35Config:
        moe = None if g.moe is None else MoeConfig(**vars(g.moe))
        return cls(g.hidden, g.vocab, g.eps, g.layer_types, g.attention, g.gdn, moe)
