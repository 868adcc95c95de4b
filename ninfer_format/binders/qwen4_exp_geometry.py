"""The geometry of a Qwen4Exp text model ("Qwen3.8-Flash-Next"): the one reading of its text
config that the binder (and later the converter and the runtime) share.

Qwen4Exp is a Qwen3.5 MoE text model (Qwen3.5's attention, Gated DeltaNet and MoE records)
with three additions, each a record of ``qwen4_exp_parts``:

* hyper-connections: the residual is ``hc_count`` streams of width H; before each token mixer
  and each FFN a low-rank mixer (rank ``hc_lowrank``) folds them into one input, and inject
  weights add the block's output back to every stream; a final mixer folds them for the head;
* per-layer embeddings (PLE) on the one-indexed ``ple_layer_ids`` (linear-attention layers
  only): hashed n-gram tables (``qwen4_exp_ngram``), key/value projections, norms and a dilated
  depthwise convolution;
* QSA on every attention layer: a token indexer that scores blocks of
  ``indexer_compress_ratio`` averaged keys and keeps ``indexer_budget`` tokens a query.

Attention layers are ``indexed_attention`` (transformers' name; ``full_attention`` in a config
means the same). The members Qwen3.5 shares stay required, as in ``qwen3_5_geometry``; the
members transformers lets a Qwen4Exp config omit take its defaults (``DEFAULTS``), and
``layer_types`` may be derived from ``full_attention_interval`` (default 4).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config_reader import ConfigReader, show
from .qwen3_5_geometry import (
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    MAX_DERIVED_LAYERS,
    Attention,
    Gdn,
    Moe,
    _read_ffn,
    _read_gdn,
    layer_types_for_interval,
)
from .qwen3_5_geometry import GeometryError as Qwen35GeometryError
from .qwen4_exp_parts import (
    HyperConnections,
    Indexer,
    Ple,
    read_hyper_connections,
    read_indexer,
    read_ple,
)

TEXT = "qwen4_exp_text"
MODEL_TYPES = ("qwen4_exp", TEXT)  # a text config read out of the composite one keeps either
ARCHITECTURE = "Qwen4ExpForCausalLM"
INDEXED_ATTENTION = "indexed_attention"
LAYER_TYPES = (LINEAR_ATTENTION, INDEXED_ATTENTION)
WHERE = "text config member '"
#: transformers' defaults (``Qwen4ExpTextConfig``) for the members a config may omit
DEFAULTS: Mapping[str, Any] = {
    "hc_count": 4,
    "hc_lowrank": 320,
    "ple_conv_kernel_size": 4,
    "ngram_size": 3,
    "heads_per_ngram": 8,
    "ngram_vocab_size_base": 20_000_000,
    "make_ngram_vocab_size_divisible_by": 128,
    "seed": 1234,
    "hidden_act": "silu",
    "norm_topk_prob": True,
    "attention_bias": False,
}
#: the layer types' derivation when ``layer_types`` is absent
DEFAULT_FULL_ATTENTION_INTERVAL = 4
#: what the rotary embedding assumes when ``rope_parameters`` omits them
ROPE_DEFAULTS: Mapping[str, Any] = {"partial_rotary_factor": 1.0, "mrope_section": [11, 11, 10]}
#: the activations transformers accepts for the GDN output gate
GATE_ACTIVATIONS = ("sigmoid", "silu")


class GeometryError(Qwen35GeometryError):
    """A text config that does not define a Qwen4Exp geometry; ``problems``: one line a member."""

    architecture = "Qwen4Exp"


@dataclass(frozen=True)
class Qwen4ExpGeometry:
    hidden: int
    vocab: int
    layer_types: tuple[str, ...]  # LINEAR_ATTENTION or INDEXED_ATTENTION a layer
    eps: float
    tie_word_embeddings: bool
    max_positions: int
    attention: Attention | None  # None: no attention layer and no MTP block
    indexer: Indexer | None  # present exactly with attention
    gdn: Gdn | None  # None: no linear-attention layer
    moe: Moe
    hyper: HyperConnections
    ple: Ple | None  # None: no PLE layer
    hidden_act: str  # the experts' activation
    output_gate: str  # the GDN output gate's activation (output_gate_type, else hidden_act)
    norm_topk_prob: bool

    @property
    def layers(self) -> int:
        return len(self.layer_types)

    @property
    def streams_width(self) -> int:  # the hyper-connection residual: hc_count · H
        return self.hyper.streams * self.hidden

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, with_mtp: bool = False) -> Qwen4ExpGeometry:
        """The geometry of a text config, or ``GeometryError`` naming every bad member.
        ``with_mtp``: the MTP block (an attention block) is read too."""
        problems: list[str] = []
        geometry = read_geometry(config, problems, with_mtp=with_mtp)
        if geometry is None:
            raise GeometryError(problems)
        return geometry


def read_geometry(
    config: Mapping[str, Any], problems: list[str], *, with_mtp: bool = False
) -> Qwen4ExpGeometry | None:
    """The geometry, or None after appending a line to ``problems`` for every member that
    prevents deriving it."""
    before = len(problems)
    c = ConfigReader(ChainMap(dict(config), dict(DEFAULTS)), WHERE, problems)
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
    topk_norm = c.boolean("norm_topk_prob")
    if c.boolean("attention_bias"):  # biased projections: parameters this contract has no name for
        c.error("attention_bias", "must be false (Qwen4Exp checkpoints have no attention biases)")
    hidden_act, output_gate = _read_activations(c)
    layer_types = _read_layer_types(c, layers)
    types = set(layer_types or ())
    attention = indexer = gdn = None
    if INDEXED_ATTENTION in types or with_mtp:
        why = " (attention layers need it)" if INDEXED_ATTENTION in types else " (the mtp block)"
        c.why = why
        attention = _read_attention(c)
        indexer = read_indexer(c, attention.rotary_dim if attention else None)
        c.why = ""
    if LINEAR_ATTENTION in types:
        c.why = " (linear_attention layers need it)"
        gdn = _read_gdn(c)
        c.why = ""
    moe = _read_ffn(c, moe=True)
    hyper = read_hyper_connections(c, hidden)
    ple = read_ple(c, layer_types, hidden, vocab)
    if len(problems) > before:
        return None
    assert hidden and vocab and eps and max_positions and layer_types and hyper
    assert tied is not None and topk_norm is not None and isinstance(moe, Moe)
    assert hidden_act is not None and output_gate is not None
    return Qwen4ExpGeometry(
        hidden, vocab, layer_types, eps, tied, max_positions, attention, indexer, gdn, moe,
        hyper, ple, hidden_act, output_gate, topk_norm,
    )  # fmt: skip


def _read_activations(c: ConfigReader) -> tuple[str | None, str | None]:
    hidden_act = c.values.get("hidden_act")
    if not isinstance(hidden_act, str):
        c.error("hidden_act", f"must be an activation name, got {show(hidden_act)}")
        return None, None
    gate = c.values.get("output_gate_type") or hidden_act
    if gate not in GATE_ACTIVATIONS:
        key = "output_gate_type" if c.values.get("output_gate_type") else "hidden_act"
        c.error(
            key, f"must name the GDN output gate, {' or '.join(GATE_ACTIVATIONS)}, got {show(gate)}"
        )
        return hidden_act, None
    return hidden_act, gate


def _read_layer_types(c: ConfigReader, layers: int | None) -> tuple[str, ...] | None:
    if c.values.get("layer_types") is None:  # transformers' derivation
        interval = DEFAULT_FULL_ATTENTION_INTERVAL
        if "full_attention_interval" in c.values:
            interval = c.positive_int("full_attention_interval")
        if layers is None or interval is None:
            return None
        if layers > MAX_DERIVED_LAYERS:  # a list this long: no model
            c.error("layer_types", f"is missing and {layers} layers are too many to derive")
            return None
        derived = layer_types_for_interval(layers, interval)
        return tuple(INDEXED_ATTENTION if t == FULL_ATTENTION else t for t in derived)
    types = c.string_list("layer_types")
    if types is None:
        return None
    types = [INDEXED_ATTENTION if t == FULL_ATTENTION else t for t in types]
    bad = [i for i, t in enumerate(types) if t not in LAYER_TYPES]
    for i in bad:
        c.error(f"layer_types[{i}]", f"must be {' or '.join(LAYER_TYPES)}, got {show(types[i])}")
    if layers is not None and len(types) != layers:
        c.error("layer_types", f"has {len(types)} entries but num_hidden_layers is {layers}")
        return None
    return None if bad else tuple(types)


def _read_attention(c: ConfigReader) -> Attention | None:
    """Qwen3.5's attention record, with the rotary members transformers defaults here."""
    values = {attribute: c.positive_int(key) for attribute, key in Attention.MEMBERS.items()}
    heads, kv_heads, head_dim = values.values()
    if heads is not None and kv_heads is not None and heads % kv_heads:
        c.error(
            "num_attention_heads",
            f"({heads}) must be a multiple of num_key_value_heads ({kv_heads})",
        )
    rope = c.section("rope_parameters")
    if rope is None:
        return None
    rope.values = ChainMap(dict(rope.values), dict(ROPE_DEFAULTS))
    rope_type = rope.values.get("rope_type", "default")
    if rope_type != "default":
        rope.error("rope_type", f'must be "default" (no scaled RoPE), got {show(rope_type)}')
    theta = rope.positive_number("rope_theta")
    factor = rope.positive_number("partial_rotary_factor")
    mrope = rope.int_list("mrope_section", 3)
    rotary = None
    if factor is not None and factor > 1:
        rope.error("partial_rotary_factor", f"must be at most 1, got {show(factor)}")
    elif factor is not None and head_dim is not None:
        rotary = int(head_dim * factor)  # transformers truncates
        if rotary < 2 or rotary % 2:
            rope.error("partial_rotary_factor", f"gives an odd or empty rotary width {rotary}")
            rotary = None
    if None in values.values() or rotary is None or theta is None or mrope is None:
        return None
    return Attention(**values, rotary_dim=rotary, rope_theta=theta, mrope_section=tuple(mrope))  # type: ignore[arg-type]
