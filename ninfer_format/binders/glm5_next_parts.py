"""The blocks of a GLM5Next text model ("GLM-5.3-Flash") that Qwen3.5 has no record for, each a
record with its config reader: Kimi Delta Attention (KDA), multi-head latent attention (MLA),
the DSA token indexer, the routing of its MoE and its manifold-constrained hyper-connections.

Readers follow ``config_reader``'s rule: each bad member is one line in the problem list and
the reader returns None; the checks are the invariants transformers' ``Glm5NextTextConfig``
validates and its modeling code assumes.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from .config_reader import MISSING, ConfigReader, show


@dataclass(frozen=True)
class Kda:
    """Kimi Delta Attention: ``heads`` heads of ``head_dim`` for query, key and value alike, a
    short convolution over [q | k | v], a per-channel forget gate and a low-rank output gate."""

    heads: int
    head_dim: int  # also the rank of the forget-gate and output-gate factorisations
    conv_kernel: int
    lower_bound: float | None  # the forget gate's safe lower bound; None: -exp(A)·softplus

    MEMBERS: ClassVar[dict[str, str]] = {
        "heads": "linear_num_heads",
        "head_dim": "linear_head_dim",
        "conv_kernel": "linear_conv_kernel_dim",
    }

    @property
    def width(self) -> int:  # heads · head_dim, for q, k, v, the gates and the output
        return self.heads * self.head_dim

    @property
    def conv_channels(self) -> int:  # channel order [q | k | v]
        return 3 * self.width


@dataclass(frozen=True)
class Mla:
    """Multi-head latent attention: queries through a rank-``q_rank`` latent, keys and values
    expanded from one compressed ``kv_rank`` latent (the cached state) per token."""

    heads: int  # query heads; key/value heads equal them once expanded
    q_rank: int
    kv_rank: int
    nope_dim: int  # the unrotated part of each query/key head
    rope_dim: int  # the rotated part, shared by all heads (0: GLM5Next attention is NoPE)
    value_dim: int

    MEMBERS: ClassVar[dict[str, str]] = {
        "heads": "num_attention_heads",
        "q_rank": "q_lora_rank",
        "kv_rank": "kv_lora_rank",
        "nope_dim": "qk_nope_head_dim",
        "value_dim": "v_head_dim",
    }

    @property
    def qk_head_dim(self) -> int:
        return self.nope_dim + self.rope_dim

    @property
    def scaling(self) -> float:  # transformers' softmax scale
        return self.qk_head_dim**-0.5


@dataclass(frozen=True)
class DsaIndexer:
    """The DSA indexer: ``heads`` query heads over one key head score pools of ``kpool``
    tokens; each query keeps ``topk`` tokens (whole pools) and, optionally, the open tail."""

    heads: int
    head_dim: int
    topk: int
    kpool: int
    always_select_tail: bool

    MEMBERS: ClassVar[dict[str, str]] = {
        "heads": "index_n_heads",
        "head_dim": "index_head_dim",
        "topk": "index_topk",
        "kpool": "index_kpool",
    }

    @property
    def pools_selected(self) -> int:
        return self.topk // self.kpool


@dataclass(frozen=True)
class Routing:
    """Sigmoid scores plus a correction bias choose ``topk_groups`` of ``groups`` expert groups
    (by each group's two best), then the top-k experts in them; weights scaled by ``scale``."""

    groups: int
    topk_groups: int
    scale: float  # routed_scaling_factor
    norm_topk_prob: bool

    MEMBERS: ClassVar[dict[str, str]] = {"groups": "n_group", "topk_groups": "topk_group"}


@dataclass(frozen=True)
class ManifoldHyperConnections:
    """``streams`` residual streams of width H mixed by Sinkhorn-normalised weights computed
    from the streams; the model's head reads their unweighted mean."""

    streams: int
    sinkhorn_iters: int
    eps: float

    MEMBERS: ClassVar[dict[str, str]] = {
        "streams": "hc_mult",
        "sinkhorn_iters": "hc_sinkhorn_iters",
    }

    @property
    def weights(self) -> int:  # pre (n) + post (n) + comb (n·n) coefficients a token
        return (2 + self.streams) * self.streams


def ints(c: ConfigReader, members: dict[str, str]) -> dict[str, int | None]:
    return {attribute: c.positive_int(key) for attribute, key in members.items()}


def number(c: ConfigReader, key: str) -> float | None:
    """Any finite JSON number (the KDA lower bound is negative); None after reporting."""
    value = c.values.get(key, MISSING)
    result = math.nan
    if type(value) in (int, float):
        with contextlib.suppress(OverflowError):
            result = float(value)
    if not math.isfinite(result):
        c.error(key, f"must be a number, got {show(value)}")
        return None
    return result


def read_kda(c: ConfigReader) -> Kda | None:
    values = ints(c, Kda.MEMBERS)
    lower_bound = None
    if c.values.get("linear_lower_bound") is not None:
        lower_bound = number(c, "linear_lower_bound")
        if lower_bound is None:
            return None
    if None in values.values():
        return None
    return Kda(**values, lower_bound=lower_bound)  # type: ignore[arg-type]


def read_mla(c: ConfigReader) -> Mla | None:
    values = ints(c, Mla.MEMBERS)
    heads, kv_heads = values["heads"], c.values.get("num_key_value_heads")
    if kv_heads is None:  # transformers' default: as many as query heads
        kv_heads = heads
    if heads is not None and kv_heads != heads:
        c.error(
            "num_key_value_heads",
            f"must equal num_attention_heads ({heads}) (MLA expands one latent per head),"
            f" got {show(kv_heads)}",
        )
    rope_dim = c.values.get("qk_rope_head_dim")
    if rope_dim != 0 or type(rope_dim) is not int:
        c.error("qk_rope_head_dim", f"must be 0 (GLM5Next attention is NoPE), got {show(rope_dim)}")
        return None
    if None in values.values() or kv_heads != heads:
        return None
    return Mla(**values, rope_dim=rope_dim)  # type: ignore[arg-type]


def read_indexer(c: ConfigReader) -> DsaIndexer | None:
    values = ints(c, DsaIndexer.MEMBERS)
    tail = c.boolean("index_kpool_always_select_tail")
    topk, kpool = values["topk"], values["kpool"]
    if topk is not None and kpool is not None and topk % kpool:
        c.error(
            "index_topk",
            f"({topk}) must be a multiple of index_kpool ({kpool}): whole pools are selected",
        )
        return None
    if None in values.values() or tail is None:
        return None
    return DsaIndexer(**values, always_select_tail=tail)  # type: ignore[arg-type]


def read_routing(c: ConfigReader, experts: int | None, top_k: int | None) -> Routing | None:
    values = ints(c, Routing.MEMBERS)
    scale = c.positive_number("routed_scaling_factor")
    norm = c.boolean("norm_topk_prob")
    groups, topk_groups = values["groups"], values["topk_groups"]
    before = len(c.problems)
    if groups is not None and experts is not None:
        if experts % groups:
            c.error("n_group", f"({groups}) must divide n_routed_experts ({experts})")
        elif experts // groups < 2:  # each group is scored by its two best experts
            c.error("n_group", f"({groups}) leaves fewer than 2 experts a group ({experts})")
        elif topk_groups is not None and topk_groups > groups:
            c.error("topk_group", f"({topk_groups}) exceeds n_group ({groups})")
        elif topk_groups is not None and top_k is not None:
            reachable = topk_groups * (experts // groups)
            if top_k > reachable:
                c.error(
                    "num_experts_per_tok",
                    f"({top_k}) exceeds the {reachable} experts of topk_group groups",
                )
    if len(c.problems) > before or None in values.values() or scale is None or norm is None:
        return None
    return Routing(**values, scale=scale, norm_topk_prob=norm)  # type: ignore[arg-type]


def read_hyper_connections(c: ConfigReader) -> ManifoldHyperConnections | None:
    values = ints(c, ManifoldHyperConnections.MEMBERS)
    eps = c.positive_number("hc_eps")
    if None in values.values() or eps is None:
        return None
    return ManifoldHyperConnections(**values, eps=eps)  # type: ignore[arg-type]


def linear_attn_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """What a Kimi-style ``linear_attn_config`` object sets; its members win over the flat
    ones, as in transformers (``safe_gate``, default true, restores the -5 lower bound)."""
    section = config.get("linear_attn_config")
    if not isinstance(section, dict):
        return {}
    renamed = {
        "head_dim": "linear_head_dim",
        "num_heads": "linear_num_heads",
        "short_conv_kernel_size": "linear_conv_kernel_dim",
        "gate_lower_bound": "linear_lower_bound",
    }
    out = {flat: section[key] for key, flat in renamed.items() if key in section}
    bound = out.get("linear_lower_bound", config.get("linear_lower_bound", -5.0))
    if section.get("safe_gate", True) and bound is None:
        out["linear_lower_bound"] = -5.0
    return out
