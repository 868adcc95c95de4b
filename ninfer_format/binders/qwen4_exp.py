"""Binder for Qwen4Exp text models: every parameter of transformers' ``Qwen4ExpForCausalLM``
under a ninfer logical name, with its shape (from ``qwen4_exp_geometry``), role and use inputs.

Names follow the Qwen3.5 contract (spec 5.2) wherever the block is Qwen3.5's: attention, GDN
and MoE reuse its generators. Qwen4Exp's additions (names this binder defines; the spec has no
Qwen4Exp section yet), with ``L = text/layers/{i}/``, ``S = hc_count·H``, ``r = hc_lowrank``:

* ``L mixer_connection/…`` and ``L ffn_connection/…`` (HF ``attn_hyper_connection`` and
  ``mlp_hyper_connection``): ``norm [S]``, ``down [r, S]`` @ ``…/normed_streams``,
  ``up [S, r]`` @ ``…/rank_activation``, ``inject [hc_count, S]`` @ ``…/normed_streams``;
  ``text/final_connection/norm|down|up`` (HF ``hyper_connection_mixer``, no inject) replace
  Qwen3.5's ``text/final_norm``; there is no per-layer input or post-attention norm;
* ``L indexer/query [n·d, H]``, ``L indexer/key [d, H]`` @ ``L mixer_input`` (HF
  ``index_qk_proj`` rows ``[0, n·d)`` and ``[n·d, (n+1)·d)``), ``L indexer/query_norm|key_norm
  [d]``;
* ``L ple/ngram_table [rows, E/heads]`` (gathered by hashed id, like the token embedding),
  ``L ple/key [S, E]`` and ``L ple/value [H, E]`` @ ``L ple/ngram_embedding``,
  ``L ple/key_norm|query_norm|convolution_norm [S]``, ``L ple/convolution [k, S]`` (HF
  ``conv1d [S, 1, k]`` transposed, as the GDN convolution).

The n-gram hash buffers (``layer_multipliers``, ``ngram_heads_vocab_sizes``,
``ngram_heads_offsets``) are derived from the config by the geometry and are not parameters.
The MTP block of Qwen4Exp is not defined by transformers, so an ``mtp`` component is reported
as unchecked rather than held to a guessed contract.

The vision component (``Qwen4ExpForConditionalGeneration``'s ``model.visual``) is Qwen3.5-MoE's
tower unchanged, so it is held to Qwen3.5's vision contract (spec 5.1, 5.4, 5.7: the
``vision/…`` names, config members and processor resources) with its own model_type,
``qwen4_exp_vision``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..schema import Directory
from .parameter_spec import ParamSpec, Role, _matrix, _vector
from .qwen3_5_layers import _attention_block, _gdn_block, _moe
from .qwen4_exp_geometry import (
    ARCHITECTURE,
    INDEXED_ATTENTION,
    MODEL_TYPES,
    TEXT,
    Qwen4ExpGeometry,
    read_geometry,
)
from .qwen4_exp_parts import Indexer, Ple
from .registry import Findings, register_binder
from .text_contract import TextContract

UNCHECKED_COMPONENTS = {"mtp": "transformers defines no Qwen4Exp MTP block"}
#: the vision component's model_type (transformers' ``Qwen4ExpVisionConfig``)
VISION_MODEL_TYPE = "qwen4_exp_vision"


def _connection(P: str, g: Qwen4ExpGeometry, *, inject: bool) -> Iterator[ParamSpec]:
    streams, rank, x = g.streams_width, g.hyper.rank, P + "normed_streams"
    yield _vector(P + "norm", streams)
    yield _matrix(P + "down", rank, streams, x)
    yield _matrix(P + "up", streams, rank, P + "rank_activation")
    if inject:
        yield _matrix(P + "inject", g.hyper.streams, streams, x)


def _indexer(L: str, n: Indexer, hidden: int) -> Iterator[ParamSpec]:
    x = L + "mixer_input"
    yield _matrix(L + "indexer/query", n.heads * n.head_dim, hidden, x)
    yield _matrix(L + "indexer/key", n.kv_heads * n.head_dim, hidden, x)
    yield _vector(L + "indexer/query_norm", n.head_dim)
    yield _vector(L + "indexer/key_norm", n.head_dim)


def _ple(L: str, i: int, p: Ple, g: Qwen4ExpGeometry) -> Iterator[ParamSpec]:
    streams, x = g.streams_width, L + "ple/ngram_embedding"
    yield _matrix(L + "ple/ngram_table", p.table_rows(i), p.head_dim)  # gathered, never multiplied
    yield _matrix(L + "ple/key", streams, p.embed_dim, x)
    yield _matrix(L + "ple/value", g.hidden, p.embed_dim, x)
    for norm in ("key_norm", "query_norm", "convolution_norm"):
        yield _vector(f"{L}ple/{norm}", streams)
    yield ParamSpec(L + "ple/convolution", (p.conv_kernel, streams), Role.CONVOLUTION)


def _decoder_layer(i: int, layer_type: str, g: Qwen4ExpGeometry) -> Iterator[ParamSpec]:
    L = f"text/layers/{i}/"
    if g.ple is not None and i in g.ple.layers:
        yield from _ple(L, i, g.ple, g)
    yield from _connection(L + "mixer_connection/", g, inject=True)
    if layer_type == INDEXED_ATTENTION:
        assert g.attention is not None and g.indexer is not None  # the reader requires them
        yield from _attention_block(L, g.attention, g.hidden)
        yield from _indexer(L, g.indexer, g.hidden)
    else:
        assert g.gdn is not None
        yield from _gdn_block(L, g.gdn, g.hidden)
    yield from _connection(L + "ffn_connection/", g, inject=True)
    yield from _moe(L, g.moe, g.hidden)


def _all_parameters(g: Qwen4ExpGeometry) -> Iterator[ParamSpec]:
    yield _matrix("text/token_embedding", g.vocab, g.hidden)  # gathered, never multiplied
    yield _matrix("text/output_head", g.vocab, g.hidden, "text/final_hidden")
    yield from _connection("text/final_connection/", g, inject=False)
    for i, layer_type in enumerate(g.layer_types):
        yield from _decoder_layer(i, layer_type, g)


CONTRACT = TextContract(
    name="Qwen4Exp",
    architecture=ARCHITECTURE,
    read_geometry=read_geometry,
    from_config=Qwen4ExpGeometry.from_config,
    parameters=_all_parameters,
    count_members="num_hidden_layers and num_experts",
    unchecked_components=UNCHECKED_COMPONENTS,
    vision_model_type=VISION_MODEL_TYPE,
)


@register_binder(*MODEL_TYPES, architectures={ARCHITECTURE: TEXT}, name="qwen4_exp")
def bind_qwen4_exp(directory: Directory, model_type: str, f: Findings) -> None:
    """Check a Qwen4Exp directory: text config, parameter coverage/shapes/formats, uses."""
    CONTRACT.bind(directory, model_type, f)


def expected_parameters(
    text_config: Mapping[str, Any],
    *,
    components: Sequence[str] = ("text",),
    vision_config: Mapping[str, Any] | None = None,
) -> list[ParamSpec]:
    """The contract as data, for producers (``TextContract.expected_parameters``)."""
    return CONTRACT.expected_parameters(text_config, components, vision_config)
