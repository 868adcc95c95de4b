"""The geometry of a GLM5Next text model ("GLM-5.3-Flash"): the one reading of its text config
that the binder (and later the converter and the runtime) share.

A GLM5Next text model is a stack of decoder layers, each one token mixer and one FFN, with
manifold-constrained hyper-connections (``glm5_next_parts``) around both:

* token mixers (``layer_types``): ``linear_attention`` layers are Kimi Delta Attention (KDA),
  ``indexed_attention`` layers (``full_attention`` means the same) are MLA whose keys are
  chosen by a DSA indexer; ``indexer_types`` says per layer whether an attention layer runs its
  own indexer (``full``) or reuses the previous layer's choice (``shared``);
* FFNs (``mlp_layer_types``): ``dense`` SwiGLU MLPs or ``sparse`` MoE with shared experts and
  grouped sigmoid routing; both clamp gate and up at ``swiglu_limit``.

Every member transformers' ``Glm5NextTextConfig`` defaults may be omitted (``DEFAULTS``), and
the three schedules are derived as it derives them: every fourth layer attention, the first
three FFNs dense, and the indexer types from ``index_topk_pattern`` or
``index_topk_freq``/``index_skip_topk_offset``. A Kimi ``linear_attn_config`` object overrides
the flat KDA members. transformers defines no MTP block (it drops the checkpoint's
``layers.{num_hidden_layers}``); ``with_mtp`` only reads the members such a block would need.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config_reader import ConfigReader, show
from .glm5_next_parts import (
    DsaIndexer,
    Kda,
    ManifoldHyperConnections,
    Mla,
    Routing,
    linear_attn_overrides,
    read_hyper_connections,
    read_indexer,
    read_kda,
    read_mla,
    read_routing,
)
from .qwen3_5_geometry import LINEAR_ATTENTION, MAX_DERIVED_LAYERS, DenseMlp, Moe
from .qwen3_5_geometry import GeometryError as Qwen35GeometryError

TEXT = "glm5_next_text"
MODEL_TYPES = ("glm5_next", TEXT)  # a text config read out of the composite one keeps either
#: transformers has no text-only head class: the text model is the language model of this one
ARCHITECTURE = "Glm5NextForConditionalGeneration"
INDEXED_ATTENTION = "indexed_attention"
LAYER_TYPES = (LINEAR_ATTENTION, INDEXED_ATTENTION)
DENSE, SPARSE = "dense", "sparse"
FULL_INDEXER, SHARED_INDEXER = "full", "shared"
#: activations the experts (always silu) and the KDA convolution kernel agree with
ACTIVATIONS = ("silu", "swish")
WHERE = "text config member '"
#: transformers' defaults (``Glm5NextTextConfig``) for the members a text model reads
DEFAULTS: Mapping[str, Any] = {
    "vocab_size": 154880, "hidden_size": 4096, "intermediate_size": 12288,
    "moe_intermediate_size": 2048, "num_hidden_layers": 45, "num_attention_heads": 64,
    "num_key_value_heads": 64, "n_shared_experts": 1, "n_routed_experts": 288,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 0, "v_head_dim": 256, "qk_nope_head_dim": 256, "n_group": 1,
    "topk_group": 1, "num_experts_per_tok": 8, "norm_topk_prob": True, "hidden_act": "silu",
    "max_position_embeddings": 1048576, "rms_norm_eps": 1e-5, "pad_token_id": 154820,
    "tie_word_embeddings": False, "attention_bias": False, "index_topk": 2048,
    "index_head_dim": 128, "index_n_heads": 32, "swiglu_limit": 10.0, "linear_head_dim": 128,
    "linear_num_heads": 64, "linear_conv_kernel_dim": 4, "linear_lower_bound": -5.0,
    "hc_mult": 4, "hc_eps": 1e-6, "hc_sinkhorn_iters": 20, "index_kpool": 16,
    "index_kpool_always_select_tail": True,
}  # fmt: skip
#: the schedules' derivations when a config omits them
ATTENTION_EVERY = 4  # layer i is attention iff i % 4 == 3
LEADING_DENSE = 3
INDEXER_DEFAULTS: Mapping[str, int] = {"index_topk_freq": 1, "index_skip_topk_offset": 2}


class GeometryError(Qwen35GeometryError):
    """A text config that does not define a GLM5Next geometry; ``problems``: one line a member."""

    architecture = "GLM5Next"


@dataclass(frozen=True)
class Glm5NextGeometry:
    hidden: int
    vocab: int
    layer_types: tuple[str, ...]  # LINEAR_ATTENTION or INDEXED_ATTENTION a layer
    mlp_types: tuple[str, ...]  # DENSE or SPARSE a layer
    indexer_types: tuple[str, ...]  # FULL_INDEXER or SHARED_INDEXER a layer (read on attention)
    eps: float
    tie_word_embeddings: bool
    max_positions: int
    pad_token: int | None
    kda: Kda | None  # None: no linear-attention layer
    mla: Mla | None  # None: no attention layer and no MTP block
    indexer: DsaIndexer | None  # None: no layer runs an indexer and no MTP block
    dense: DenseMlp | None  # None: no dense FFN
    moe: Moe | None  # None: no sparse FFN and no MTP block
    routing: Routing | None  # present exactly with moe
    hyper: ManifoldHyperConnections
    hidden_act: str
    swiglu_limit: float

    @property
    def layers(self) -> int:
        return len(self.layer_types)

    def runs_indexer(self, layer: int) -> bool:
        """Whether ``layer`` has its own DSA indexer (and so its parameters)."""
        return (
            self.layer_types[layer] == INDEXED_ATTENTION
            and self.indexer_types[layer] == FULL_INDEXER
        )

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, with_mtp: bool = False) -> Glm5NextGeometry:
        """The geometry of a text config, or ``GeometryError`` naming every bad member.
        ``with_mtp``: the members an MTP block (MLA, indexer and MoE) needs are read too."""
        problems: list[str] = []
        geometry = read_geometry(config, problems, with_mtp=with_mtp)
        if geometry is None:
            raise GeometryError(problems)
        return geometry


def read_geometry(
    config: Mapping[str, Any], problems: list[str], *, with_mtp: bool = False
) -> Glm5NextGeometry | None:
    """The geometry, or None after appending a line to ``problems`` for every member that
    prevents deriving it."""
    before = len(problems)
    given = dict(config)
    c = ConfigReader(ChainMap(linear_attn_overrides(given), given, dict(DEFAULTS)), WHERE, problems)
    if "model_type" in config and config["model_type"] not in MODEL_TYPES:
        c.error(
            "model_type", f"must be {' or '.join(MODEL_TYPES)}, got {show(config['model_type'])}"
        )
    hidden = c.positive_int("hidden_size")
    vocab = c.positive_int("vocab_size")
    layers = c.positive_int("num_hidden_layers")
    max_positions = c.positive_int("max_position_embeddings")
    tied = c.boolean("tie_word_embeddings")
    eps = c.positive_number("rms_norm_eps")
    swiglu_limit = c.positive_number("swiglu_limit")
    if c.boolean("attention_bias"):  # biased projections: parameters this contract has no name for
        c.error("attention_bias", "must be false (GLM5Next checkpoints have no attention biases)")
    hidden_act = c.values.get("hidden_act")
    if hidden_act not in ACTIVATIONS:
        c.error("hidden_act", f"must be {' or '.join(ACTIVATIONS)}, got {show(hidden_act)}")
    pad = c.values.get("pad_token_id")
    if pad is not None and (type(pad) is not int or pad < 0 or (vocab and pad >= vocab)):
        c.error("pad_token_id", f"must be null or a token id below vocab_size, got {show(pad)}")
    layer_types = _schedule(c, "layer_types", layers, LAYER_TYPES, _default_layer_types)
    mlp_types = _schedule(c, "mlp_layer_types", layers, (DENSE, SPARSE), _default_mlp_types)
    indexer_types = _schedule(
        c, "indexer_types", layers, (FULL_INDEXER, SHARED_INDEXER), _default_indexer_types
    )
    if layer_types and indexer_types:
        _check_shared_indexers(c, layer_types, indexer_types)
    types, ffns = set(layer_types or ()), set(mlp_types or ())
    runs_indexer = any(
        t == INDEXED_ATTENTION and x == FULL_INDEXER
        for t, x in zip(layer_types or (), indexer_types or (), strict=False)
    )  # (the lengths differ only when one of them is already reported)
    kda = mla = indexer = dense = moe = routing = None
    if LINEAR_ATTENTION in types:
        kda = _section(c, " (linear_attention layers need it)", read_kda)
    if INDEXED_ATTENTION in types or with_mtp:
        why = " (attention layers need it)" if INDEXED_ATTENTION in types else " (the mtp block)"
        mla = _section(c, why, read_mla)
        if runs_indexer or with_mtp:
            indexer = _section(c, why, read_indexer)
    if DENSE in ffns:
        dense = _section(c, " (dense layers need it)", _read_dense)
    if SPARSE in ffns or with_mtp:
        moe = _section(c, " (sparse layers need it)", _read_moe)
        experts, top_k = (moe.experts, moe.top_k) if moe else (None, None)
        routing = read_routing(c, experts, top_k)
    hyper = read_hyper_connections(c)
    if len(problems) > before:
        return None
    assert hidden and vocab and eps and max_positions and swiglu_limit and hyper
    assert layer_types and mlp_types and indexer_types and tied is not None
    return Glm5NextGeometry(
        hidden, vocab, layer_types, mlp_types, indexer_types, eps, tied, max_positions, pad,
        kda, mla, indexer, dense, moe, routing, hyper, hidden_act, swiglu_limit,
    )  # fmt: skip


def _section(c: ConfigReader, why: str, reader: Any) -> Any:
    c.why = why
    try:
        return reader(c)
    finally:
        c.why = ""


def _read_dense(c: ConfigReader) -> DenseMlp | None:
    width = c.positive_int("intermediate_size")
    return None if width is None else DenseMlp(width)


def _read_moe(c: ConfigReader) -> Moe | None:
    experts = c.positive_int("n_routed_experts")
    top_k = c.positive_int("num_experts_per_tok")
    width = c.positive_int("moe_intermediate_size")
    shared = c.positive_int("n_shared_experts")  # shared experts are one MLP, n times as wide
    if experts is not None and top_k is not None and top_k > experts:
        c.error("num_experts_per_tok", f"({top_k}) exceeds n_routed_experts ({experts})")
        return None
    if experts is None or top_k is None or width is None or shared is None:
        return None
    return Moe(experts, top_k, width, shared * width)


def _default_layer_types(c: ConfigReader, layers: int) -> list[str]:
    attention = [i % ATTENTION_EVERY == ATTENTION_EVERY - 1 for i in range(layers)]
    return [INDEXED_ATTENTION if a else LINEAR_ATTENTION for a in attention]


def _default_mlp_types(c: ConfigReader, layers: int) -> list[str]:
    return [DENSE] * min(LEADING_DENSE, layers) + [SPARSE] * (layers - LEADING_DENSE)


def _default_indexer_types(c: ConfigReader, layers: int) -> list[str] | None:
    pattern = c.values.get("index_topk_pattern")
    if isinstance(pattern, str):
        if set(pattern) - {"F", "S"}:
            c.error("index_topk_pattern", f"must be letters F and S, got {show(pattern)}")
            return None
        return [FULL_INDEXER if letter == "F" else SHARED_INDEXER for letter in pattern]
    if pattern is not None:
        if not isinstance(pattern, list):
            c.error("index_topk_pattern", f"must be a string or a list, got {show(pattern)}")
            return None
        return pattern  # checked entry by entry as indexer_types
    values = ChainMap(dict(c.values), dict(INDEXER_DEFAULTS))
    freq, offset = values["index_topk_freq"], values["index_skip_topk_offset"]
    if type(freq) is not int or type(offset) is not int:
        c.error("index_topk_freq", f"and index_skip_topk_offset must be integers, got {show(freq)}")
        return None
    freq = max(freq, 1)
    full = [max(i - offset + 1, 0) % freq == 0 for i in range(layers)]
    return [FULL_INDEXER if f else SHARED_INDEXER for f in full]


def _schedule(
    c: ConfigReader, key: str, layers: int | None, allowed: tuple[str, ...], derive: Any
) -> tuple[str, ...] | None:
    """A per-layer list of ``allowed`` names, given or derived as transformers derives it."""
    if c.values.get(key) is None:
        if layers is None:
            return None
        if layers > MAX_DERIVED_LAYERS:  # a list this long: no model
            c.error(key, f"is missing and {layers} layers are too many to derive")
            return None
        derived = derive(c, layers)
        if derived is None:
            return None
        values = list(derived)
    else:
        values = c.string_list(key)
        if values is None:
            return None
    if key == "layer_types":
        values = [INDEXED_ATTENTION if t == "full_attention" else t for t in values]
    bad = [i for i, t in enumerate(values) if t not in allowed]
    for i in bad:
        c.error(f"{key}[{i}]", f"must be {' or '.join(allowed)}, got {show(values[i])}")
    if layers is not None and len(values) != layers:
        c.error(key, f"has {len(values)} entries but num_hidden_layers is {layers}")
        return None
    return None if bad else tuple(values)


def _check_shared_indexers(
    c: ConfigReader, layer_types: tuple[str, ...], indexer_types: tuple[str, ...]
) -> None:
    """A shared attention layer reuses the top-k that the layer right before it hands on, and
    only an attention layer running its own indexer hands one on."""
    hands_on = [
        t == INDEXED_ATTENTION and x == FULL_INDEXER
        for t, x in zip(layer_types, indexer_types, strict=True)
    ]
    orphans = [
        i
        for i, (t, x) in enumerate(zip(layer_types, indexer_types, strict=True))
        if t == INDEXED_ATTENTION and x == SHARED_INDEXER and (i == 0 or not hands_on[i - 1])
    ]
    if orphans:
        c.error(
            "indexer_types",
            f"makes attention layers {orphans} shared, but the layer before each does not run"
            " an indexer of its own",
        )
