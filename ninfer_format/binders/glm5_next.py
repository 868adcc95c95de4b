"""Binder for GLM5Next text models ("GLM-5.3-Flash"): every text parameter of transformers'
``Glm5NextForConditionalGeneration`` (its ``model.language_model.*`` and ``lm_head``; there is
no text-only head class) under a ninfer logical name, with its shape (from
``glm5_next_geometry``), role and use inputs.

Names follow the Qwen3.5 contract (spec 5.2) where the block is the same: the globals, the
per-layer norms and the dense ``mlp/`` reuse its names. GLM5Next's own blocks (names this binder
defines; the spec has no GLM5Next section yet), with ``L = text/layers/{i}/``, ``n = hc_mult``,
``W = linear_num_heads·linear_head_dim``, ``D = linear_head_dim``:

* ``L mixer_connection/…`` and ``L ffn_connection/…`` (HF ``attn_hc`` and ``ffn_hc``):
  ``projection [(2+n)·n, n·H]`` @ ``…/normed_streams`` (``fn``), ``bias [(2+n)·n]`` and
  ``scale [3]`` **fp32** (``base``, ``scale``); the head reads the streams' mean, then
  ``text/final_norm``;
* KDA (``self_attn`` of a linear-attention layer): ``L kda/query|key|value [W, H]``,
  ``L kda/b_projection [heads, H]``, ``L kda/forget_down|gate_down [D, H]`` @ ``L mixer_input``;
  ``L kda/forget_up [W, D]`` @ ``L kda/forget_rank``; ``L kda/gate_up [W, D]`` @
  ``L kda/gate_rank``; ``L kda/a_log [heads]``, ``L kda/dt_bias [W]`` **fp32**;
  ``L kda/convolution [T, 3W]`` (HF ``[3W, 1, T]`` transposed, as the GDN convolution);
  ``L kda/norm [D]``; ``L kda/output [H, W]`` @ ``L kda/gated_output``;
* MLA (``self_attn`` of an attention layer): ``L mla/query_down [q_rank, H]`` and
  ``L mla/kv_down [kv_rank + rope, H]`` @ ``L mixer_input``; ``L mla/query_norm [q_rank]``,
  ``L mla/kv_norm [kv_rank]``; ``L mla/query_up [heads·(nope+rope), q_rank]`` @
  ``L mla/query_latent``; ``L mla/key_up [heads·nope, kv_rank]`` and
  ``L mla/value_up [heads·v, kv_rank]`` @ ``L mla/kv_latent`` (HF ``kv_b_proj`` interleaves per
  head ``[key_h (nope rows), value_h (v rows)]``: split by head, never mid-way, as ``q_proj``
  into query and gate in spec 5.2); ``L mla/output [H, heads·v]`` @ ``L mla/attention_output``;
* the DSA indexer of an attention layer whose ``indexer_types`` entry is ``full``:
  ``L indexer/query [n_i·d_i, q_rank]`` @ ``L mla/query_latent``; ``L indexer/key [d_i, H]``,
  ``L indexer/head_weights [n_i, H]``, ``L indexer/pool_gate [d_i, H]`` @ ``L mixer_input``;
  ``L indexer/key_norm``, ``L indexer/key_norm_bias [d_i]`` (a LayerNorm);
  ``L indexer/pool_position [index_kpool, d_i]`` (added elementwise);
* MoE (``sparse`` layers): ``L moe/router [E, H]`` @ ``L ffn_input``, ``L moe/router_bias [E]``
  **fp32** (HF ``e_score_correction_bias``, a buffer of the state dict); experts and the shared
  MLP (width ``n_shared_experts·moe_intermediate_size``) under Qwen3.5's ``moe/`` names; there
  is no ``moe/shared_score``;
* MTP (transformers defines no GLM5Next MTP block; the layout is DeepSeek-V3's, checkpoint
  layer ``num_hidden_layers``, which transformers ignores): ``mtp/input_projection [H, 2H]`` @
  ``mtp/stem_input`` (``[embedding_norm(embedding) | hidden_norm(hidden)]``),
  ``mtp/embedding_norm``, ``mtp/hidden_norm``, ``mtp/final_norm`` ``[H]``, and one decoder
  layer ``mtp/layers/0/…`` under the text layers' names: both connections, MLA with its own
  indexer, MoE (the geometry read ``with_mtp`` defines them even where no text layer has one);
* vision (``model.visual``, model_type ``glm5_next_vision``): the names and geometry of
  ``glm5_next_vision``; identity and processor resources are checked as Qwen3.5's (spec 5.7).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..schema import Directory
from .glm5_next_geometry import (
    ARCHITECTURE,
    INDEXED_ATTENTION,
    MODEL_TYPES,
    SPARSE,
    TEXT,
    Glm5NextGeometry,
    read_geometry,
)
from .glm5_next_parts import DsaIndexer, Kda, Mla
from .glm5_next_vision import VISION_MODEL_TYPE, read_vision, vision_parameters
from .parameter_spec import ParamSpec, Role, _fp32_vector, _matrix, _vector
from .qwen3_5_geometry import Moe
from .qwen3_5_layers import _dense_mlp, _experts
from .qwen3_5_mtp import _mtp_stem
from .registry import Findings, register_binder
from .text_contract import TextContract, VisionTower

UNCHECKED_COMPONENTS: dict[str, str] = {}
MTP_LAYER = "mtp/layers/0/"
#: the mtp component's architecture (no transformers class exists; the name says the layout)
MTP_ARCHITECTURE = "Glm5NextMTP"


def _connection(P: str, g: Glm5NextGeometry) -> Iterator[ParamSpec]:
    hc = g.hyper
    yield _matrix(P + "projection", hc.weights, hc.streams * g.hidden, P + "normed_streams")
    yield _fp32_vector(P + "bias", hc.weights)
    yield _fp32_vector(P + "scale", 3)  # pre, post and comb


def _kda(L: str, k: Kda, hidden: int) -> Iterator[ParamSpec]:
    w, d, x = k.width, k.head_dim, L + "mixer_input"
    for projection in ("query", "key", "value"):
        yield _matrix(f"{L}kda/{projection}", w, hidden, x)
    yield ParamSpec(L + "kda/convolution", (k.conv_kernel, k.conv_channels), Role.CONVOLUTION)
    yield _matrix(L + "kda/forget_down", d, hidden, x)
    yield _matrix(L + "kda/forget_up", w, d, L + "kda/forget_rank")
    yield _fp32_vector(L + "kda/dt_bias", w)
    yield _fp32_vector(L + "kda/a_log", k.heads)
    yield _matrix(L + "kda/b_projection", k.heads, hidden, x)
    yield _matrix(L + "kda/gate_down", d, hidden, x)
    yield _matrix(L + "kda/gate_up", w, d, L + "kda/gate_rank")
    yield _vector(L + "kda/norm", d)
    yield _matrix(L + "kda/output", hidden, w, L + "kda/gated_output")


def _mla(L: str, m: Mla, hidden: int) -> Iterator[ParamSpec]:
    x, q_latent, kv_latent = L + "mixer_input", L + "mla/query_latent", L + "mla/kv_latent"
    yield _matrix(L + "mla/query_down", m.q_rank, hidden, x)
    yield _vector(L + "mla/query_norm", m.q_rank)
    yield _matrix(L + "mla/query_up", m.heads * m.qk_head_dim, m.q_rank, q_latent)
    yield _matrix(L + "mla/kv_down", m.kv_rank + m.rope_dim, hidden, x)
    yield _vector(L + "mla/kv_norm", m.kv_rank)
    yield _matrix(L + "mla/key_up", m.heads * m.nope_dim, m.kv_rank, kv_latent)
    yield _matrix(L + "mla/value_up", m.heads * m.value_dim, m.kv_rank, kv_latent)
    yield _matrix(L + "mla/output", hidden, m.heads * m.value_dim, L + "mla/attention_output")


def _indexer(L: str, n: DsaIndexer, m: Mla, hidden: int) -> Iterator[ParamSpec]:
    x = L + "mixer_input"
    yield _matrix(L + "indexer/query", n.heads * n.head_dim, m.q_rank, L + "mla/query_latent")
    yield _matrix(L + "indexer/key", n.head_dim, hidden, x)
    yield _vector(L + "indexer/key_norm", n.head_dim)
    yield _vector(L + "indexer/key_norm_bias", n.head_dim)
    yield _matrix(L + "indexer/head_weights", n.heads, hidden, x)
    yield _matrix(L + "indexer/pool_gate", n.head_dim, hidden, x)
    yield ParamSpec(L + "indexer/pool_position", (n.kpool, n.head_dim), Role.VECTOR)


def _moe(L: str, m: Moe, hidden: int) -> Iterator[ParamSpec]:
    x = L + "ffn_input"
    yield _matrix(L + "moe/router", m.experts, hidden, x)
    yield _fp32_vector(L + "moe/router_bias", m.experts)
    yield from _experts(L, m, hidden)


def _layer(
    L: str, g: Glm5NextGeometry, *, attention: bool, indexer: bool, sparse: bool
) -> Iterator[ParamSpec]:
    """One decoder layer under ``L``: MLA (with its own indexer where ``indexer``) or KDA,
    then the MoE where ``sparse``, else the dense MLP."""
    yield from _connection(L + "mixer_connection/", g)
    yield _vector(L + "input_norm", g.hidden)
    if attention:
        assert g.mla is not None  # the reader requires it for such layers
        yield from _mla(L, g.mla, g.hidden)
        if indexer:
            assert g.indexer is not None
            yield from _indexer(L, g.indexer, g.mla, g.hidden)
    else:
        assert g.kda is not None
        yield from _kda(L, g.kda, g.hidden)
    yield from _connection(L + "ffn_connection/", g)
    yield _vector(L + "post_attention_norm", g.hidden)
    if sparse:
        assert g.moe is not None
        yield from _moe(L, g.moe, g.hidden)
    else:
        assert g.dense is not None
        yield from _dense_mlp(L, g.dense, g.hidden)


def _decoder_layer(i: int, g: Glm5NextGeometry) -> Iterator[ParamSpec]:
    return _layer(
        f"text/layers/{i}/",
        g,
        attention=g.layer_types[i] == INDEXED_ATTENTION,
        indexer=g.runs_indexer(i),
        sparse=g.mlp_types[i] == SPARSE,
    )


def _all_parameters(g: Glm5NextGeometry) -> Iterator[ParamSpec]:
    yield _matrix("text/token_embedding", g.vocab, g.hidden)  # gathered, never multiplied
    yield _matrix("text/output_head", g.vocab, g.hidden, "text/final_hidden")
    yield _vector("text/final_norm", g.hidden)
    for i in range(g.layers):
        yield from _decoder_layer(i, g)


def mtp_parameters(g: Glm5NextGeometry) -> Iterator[ParamSpec]:
    """The MTP block; ``g`` read ``with_mtp`` (MLA, indexer and MoE defined)."""
    assert g.mla is not None and g.indexer is not None and g.moe is not None
    yield from _mtp_stem(g.hidden)
    yield from _layer(MTP_LAYER, g, attention=True, indexer=True, sparse=True)


CONTRACT = TextContract(
    name="GLM5Next",
    architecture=ARCHITECTURE,
    read_geometry=read_geometry,
    from_config=Glm5NextGeometry.from_config,
    parameters=_all_parameters,
    count_members="num_hidden_layers and n_routed_experts",
    unchecked_components=UNCHECKED_COMPONENTS,
    mtp=mtp_parameters,
    vision_model_type=VISION_MODEL_TYPE,
    vision_tower=VisionTower(read_vision, vision_parameters),
)


@register_binder(*MODEL_TYPES, architectures={ARCHITECTURE: TEXT}, name="glm5_next")
def bind_glm5_next(directory: Directory, model_type: str, f: Findings) -> None:
    """Check a GLM5Next directory: text config, parameter coverage/shapes/formats, uses."""
    CONTRACT.bind(directory, model_type, f)


def expected_parameters(
    text_config: Mapping[str, Any],
    *,
    components: Sequence[str] = ("text",),
    vision_config: Mapping[str, Any] | None = None,
) -> list[ParamSpec]:
    """The contract as data, for producers (``TextContract.expected_parameters``)."""
    return CONTRACT.expected_parameters(text_config, components, vision_config)
