"""The geometry of a Qwen3.5 / Qwen3.6 text model, read from the artifact's text config.

The binder has already validated the config against the parameter contract; this only turns
it into typed numbers the model code can use without dictionary lookups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ModelError

FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"


@dataclass(frozen=True)
class AttentionConfig:
    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int  # the first rotary_dim dims of each head rotate (partial RoPE)
    rope_theta: float


@dataclass(frozen=True)
class GdnConfig:
    key_heads: int
    key_dim: int
    value_heads: int
    value_dim: int
    conv_kernel: int

    @property
    def key_width(self) -> int:
        return self.key_heads * self.key_dim

    @property
    def value_width(self) -> int:
        return self.value_heads * self.value_dim

    @property
    def conv_channels(self) -> int:  # channel order [q | k | v]
        return 2 * self.key_width + self.value_width


@dataclass(frozen=True)
class MoeConfig:
    experts: int
    top_k: int
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
        try:
            layer_types = tuple(c["layer_types"])
            # full-attention layers and the MTP block both need the attention geometry
            attention = _attention(c) if "num_attention_heads" in c else None
            gdn = None
            if LINEAR_ATTENTION in layer_types:
                gdn = GdnConfig(
                    int(c["linear_num_key_heads"]),
                    int(c["linear_key_head_dim"]),
                    int(c["linear_num_value_heads"]),
                    int(c["linear_value_head_dim"]),
                    int(c["linear_conv_kernel_dim"]),
                )
            moe = None
            if c.get("model_type") == "qwen3_5_moe_text":
                moe = MoeConfig(int(c["num_experts"]), int(c["num_experts_per_tok"]))
            return cls(
                hidden=int(c["hidden_size"]),
                vocab=int(c["vocab_size"]),
                eps=float(c["rms_norm_eps"]),
                layer_types=layer_types,
                attention=attention,
                gdn=gdn,
                moe=moe,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"text config cannot define a Qwen3.5 model: {exc!r}") from None


def _attention(c: Mapping[str, Any]) -> AttentionConfig:
    rope = dict(c.get("rope_parameters") or {})
    head_dim = int(c["head_dim"])
    # HF's defaults when a key is absent: a quarter of each head rotates, theta 1e4
    partial = float(rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.25)))
    theta = float(rope.get("rope_theta", c.get("rope_theta", 10000.0)))
    return AttentionConfig(
        heads=int(c["num_attention_heads"]),
        kv_heads=int(c["num_key_value_heads"]),
        head_dim=head_dim,
        rotary_dim=int(head_dim * partial),
        rope_theta=theta,
    )
