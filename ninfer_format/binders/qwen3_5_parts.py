"""The blocks of a Qwen3.5 / Qwen3.6 text model, each a record with its config reader: gated
full attention, Gated DeltaNet, the dense MLP and the routed experts. ``qwen3_5_geometry``
reads a text config into them (and re-exports them; Qwen4Exp's geometry reads them too).

Readers follow ``config_reader``'s rule: each bad member is one line in the problem list and
the reader returns None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from .config_reader import ConfigReader, show


@dataclass(frozen=True)
class Attention:
    """Gated full attention: query (and gate) heads over grouped key/value heads."""

    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int  # the first rotary_dim dims of each head rotate (partial RoPE)
    rope_theta: float
    mrope_section: tuple[int, ...]  # rotary frequency pairs per (t, h, w) position axis

    #: the integer members as the config spells them (also what error lines name)
    MEMBERS: ClassVar[dict[str, str]] = {
        "heads": "num_attention_heads",
        "kv_heads": "num_key_value_heads",
        "head_dim": "head_dim",
    }


@dataclass(frozen=True)
class Gdn:
    """Gated DeltaNet: key heads (K), value heads (a multiple of K), the short convolution."""

    key_heads: int
    key_dim: int
    value_heads: int
    value_dim: int
    conv_kernel: int

    MEMBERS: ClassVar[dict[str, str]] = {
        "key_heads": "linear_num_key_heads",
        "key_dim": "linear_key_head_dim",
        "value_heads": "linear_num_value_heads",
        "value_dim": "linear_value_head_dim",
        "conv_kernel": "linear_conv_kernel_dim",
    }

    @property
    def key_width(self) -> int:  # Kg
        return self.key_heads * self.key_dim

    @property
    def value_width(self) -> int:  # Vg
        return self.value_heads * self.value_dim

    @property
    def conv_channels(self) -> int:  # channel order [q | k | v]
        return 2 * self.key_width + self.value_width

    @property
    def ratio(self) -> int:  # value heads reading each key head
        return self.value_heads // self.key_heads


@dataclass(frozen=True)
class DenseMlp:
    intermediate: int

    MEMBERS: ClassVar[dict[str, str]] = {"intermediate": "intermediate_size"}


@dataclass(frozen=True)
class Moe:
    """Routed experts (``top_k`` of them a token) and the always-on shared expert."""

    experts: int
    top_k: int
    expert_width: int
    shared_width: int

    MEMBERS: ClassVar[dict[str, str]] = {
        "experts": "num_experts",
        "top_k": "num_experts_per_tok",
        "expert_width": "moe_intermediate_size",
        "shared_width": "shared_expert_intermediate_size",
    }


def _ints(c: ConfigReader, members: Mapping[str, str]) -> dict[str, int | None]:
    return {attribute: c.positive_int(key) for attribute, key in members.items()}


def _read_attention(c: ConfigReader, why: str) -> Attention | None:
    c.why = why
    values = _ints(c, Attention.MEMBERS)
    heads, kv_heads, head_dim = values.values()
    rope = c.section("rope_parameters")
    theta = factor = mrope = None
    if rope is not None:
        theta = rope.positive_number("rope_theta")
        factor = rope.positive_number("partial_rotary_factor")
        mrope = rope.int_list("mrope_section", 3)
    c.why = ""
    rotary = None
    if rope is not None and factor is not None and factor > 1:
        rope.error("partial_rotary_factor", f"must be at most 1, got {show(factor)}")
    elif rope is not None and factor is not None and mrope is not None and head_dim is not None:
        # mrope splits the rotary frequency pairs over (t, h, w): 2·Σ = rotated dims.
        # Configs may carry f32-rounded factors (spec 8.6), hence a relative tolerance.
        covered = 2 * sum(mrope)
        try:
            rotated = head_dim * factor
            matches = math.isclose(covered, rotated, rel_tol=1e-6)
        except OverflowError:  # head_dim beyond float range: cannot match a real section
            rotated, matches = math.inf, False
        if matches:
            rotary = round(rotated)
        else:
            rope.error(
                "mrope_section",
                f"covers {covered} rotated dims but head_dim × partial_rotary_factor = {rotated:g}",
            )
    if heads is not None and kv_heads is not None and heads % kv_heads:
        c.error(
            "num_attention_heads",
            f"({heads}) must be a multiple of num_key_value_heads ({kv_heads})",
        )
    if None in values.values() or rotary is None or theta is None or mrope is None:
        return None
    rope_members = dict(rotary_dim=rotary, rope_theta=theta, mrope_section=tuple(mrope))
    return Attention(**values, **rope_members)  # type: ignore[arg-type]


def _read_gdn(c: ConfigReader) -> Gdn | None:
    values = _ints(c, Gdn.MEMBERS)
    key_heads, value_heads = values["key_heads"], values["value_heads"]
    if key_heads is not None and value_heads is not None and value_heads % key_heads:
        c.error(
            "linear_num_value_heads",
            f"({value_heads}) must be a multiple of linear_num_key_heads ({key_heads})",
        )
    if None in values.values():
        return None
    return Gdn(**values)  # type: ignore[arg-type]


def _read_ffn(c: ConfigReader, moe: bool) -> DenseMlp | Moe | None:
    if not moe:
        values = _ints(c, DenseMlp.MEMBERS)
        return None if None in values.values() else DenseMlp(**values)  # type: ignore[arg-type]
    values = _ints(c, Moe.MEMBERS)
    experts, top_k = values["experts"], values["top_k"]
    if experts is not None and top_k is not None and top_k > experts:
        c.error("num_experts_per_tok", f"({top_k}) exceeds num_experts ({experts})")
    if None in values.values():
        return None
    return Moe(**values)  # type: ignore[arg-type]
