"""Qwen4Exp checkpoints (HF names) -> the logical parameters of the Qwen4Exp binder
(``ninfer_format.binders.qwen4_exp``).

Both layouts of real checkpoints: text-only ``Qwen4ExpForCausalLM`` (``model.``) and
multimodal ``Qwen4ExpForConditionalGeneration`` (language model under
``model.language_model.``). The multimodal layout's vision tower (``model.visual.*``) is
Qwen3.5-MoE's and maps, when the vision component is selected, through the Qwen3.5 adapter's
vision names (fused ``attn.qkv`` split by rows, the patch convolution read flat).

The blocks Qwen4Exp shares with Qwen3.5 (attention with its per-head query/gate interleave, GDN
with its ``in_proj_qkv`` split and convolution transpose, fused or per-expert MoE) map through
the Qwen3.5 adapter's name table. Qwen4Exp's additions:

* hyper-connections: ``attn_hyper_connection`` / ``mlp_hyper_connection`` / the final
  ``hyper_connection_mixer`` (``hc_norm``, ``input_mix_weight_down|up``,
  ``block_inject_weight``) -> ``mixer_connection`` / ``ffn_connection`` / ``final_connection``;
* the QSA indexer: ``self_attn.indexer.index_qk_proj`` rows split into query and key;
* PLE: ``ple.ple_embedding.ngram_embedding`` (the n-gram table, saved by transformers as
  ``shard_{j}`` row blocks: ``ngram_table_pieces``), ``ple.key_proj|value_proj``,
  ``ple.norm_key|norm_query|norm_conv`` and ``ple.conv1d`` (transposed like the GDN one). The
  hash buffers transformers saves beside them are derived from the config and not read.

MTP (``mtp.*``): transformers defines no Qwen4Exp MTP block; the layout read is the format's
``qwen4_exp_mtp``: Qwen3.5's stem (``mtp.fc`` [H, 2H], ``mtp.pre_fc_norm_embedding`` [H]) with
the hidden-state norm over all ``hc_count`` streams (``mtp.pre_fc_norm_hidden`` [hc·H]),
``mtp.layers.{i}`` Qwen4Exp attention decoder layers (hyper-connections, attention, MoE; an
indexer only where the checkpoint has one) and the MTP's own final mixer
``mtp.hyper_connection_mixer``. An ``mtp.*`` tensor outside that layout is an error naming
it, never silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ninfer_format.binders.qwen3_5 import ParamSpec
from ninfer_format.binders.qwen4_exp import expected_parameters
from ninfer_format.binders.qwen4_exp_geometry import ARCHITECTURE, MODEL_TYPES, Qwen4ExpGeometry
from ninfer_format.binders.qwen4_exp_mtp import MTP_ARCHITECTURE, mtp_parameters

from ..errors import RecipeError
from .base import Architecture, LogicalTensor, SourcePiece, register_adapter
from .qwen3_5 import Pieces, _Names, _rows, _vision_pieces, _whole

#: hyper-connection parameter -> HF module suffix (``{connection}.{suffix}.weight``)
_CONNECTION = {
    "norm": "hc_norm",
    "down": "input_mix_weight_down",
    "up": "input_mix_weight_up",
    "inject": "block_inject_weight",
}
#: logical connection -> HF module of a decoder layer
_LAYER_CONNECTIONS = {
    "mixer_connection": "attn_hyper_connection",
    "ffn_connection": "mlp_hyper_connection",
}
_FINAL_MIXER = "hyper_connection_mixer"
#: PLE and indexer parameters read whole: logical suffix -> HF name suffix
_SIMPLE = {
    "indexer/query_norm": "self_attn.indexer.q_layernorm.weight",
    "indexer/key_norm": "self_attn.indexer.k_layernorm.weight",
    "ple/key": "ple.key_proj.weight",
    "ple/value": "ple.value_proj.weight",
    "ple/key_norm": "ple.norm_key.weight",
    "ple/query_norm": "ple.norm_query.weight",
    "ple/convolution_norm": "ple.norm_conv.weight",
    "ple/convolution": "ple.conv1d.weight",
}
INDEX_QK = "self_attn.indexer.index_qk_proj.weight"
NGRAM_TABLE = "ple.ple_embedding.ngram_embedding"
#: transformers' default number of parts a saved n-gram table is cut into
DEFAULT_NGRAM_PARTS = 512
#: the MTP stem: logical name -> HF name
_MTP_STEM = {
    "mtp/input_projection": "mtp.fc.weight",
    "mtp/embedding_norm": "mtp.pre_fc_norm_embedding.weight",
    "mtp/hidden_norm": "mtp.pre_fc_norm_hidden.weight",
}
_MTP_LAYER = re.compile(r"mtp\.layers\.(\d+)\.")
#: names a quantized checkpoint stores beside a weight (its codes' scales and divisors)
_ENCODING_FIELD = re.compile(r"(_packed|_scale|_scale_2|_scale_inv|_global_scale)$")
#: parameters whose source is ``[C, 1, T]`` and whose logical shape is ``[T, C]``
_TRANSPOSED = ("gdn/convolution", "ple/convolution")


class _Qwen4Names(_Names):
    """Qwen3.5's lookups plus Qwen4Exp's hyper-connections, indexer and PLE."""

    geometry: Qwen4ExpGeometry  # type: ignore[assignment]  (the fields _Names reads)

    def globals(self, suffix: str) -> Pieces:
        if suffix.startswith("final_connection/"):
            return self.connection(self.text + _FINAL_MIXER, suffix.split("/")[1])
        return super().globals(suffix)

    def connection(self, module: str, part: str) -> Pieces:
        return _whole(f"{module}.{_CONNECTION[part]}.weight")

    def layer(self, prefix: str, suffix: str) -> Pieces:
        block, _, part = suffix.partition("/")
        if block in _LAYER_CONNECTIONS:
            return self.connection(prefix + _LAYER_CONNECTIONS[block], part)
        if suffix in _SIMPLE:
            return _whole(prefix + _SIMPLE[suffix])
        if suffix in ("indexer/query", "indexer/key"):
            indexer = self.geometry.indexer
            assert indexer is not None  # the parameter exists because the layer is attention
            query = indexer.heads * indexer.head_dim
            key = indexer.kv_heads * indexer.head_dim
            start, stop = (0, query) if suffix == "indexer/query" else (query, query + key)
            return _rows(prefix + INDEX_QK, start, stop)
        return super().layer(prefix, suffix)


def ngram_table_pieces(keys: set[str], prefix: str, rows: int, parts: int) -> Pieces:
    """The n-gram table of the layer at HF ``prefix``: whole, or the shards transformers saves
    (``torch.chunk`` of the rows into ``split_ngram_parts``: ``ceil(rows / parts)`` rows a
    shard, so there may be fewer shards than parts), concatenated in shard order. Every shard
    is named, so a missing one is reported by name when the sources are checked."""
    whole = f"{prefix}{NGRAM_TABLE}.weight"
    if whole in keys:
        return _whole(whole)
    per_shard = -(-rows // parts)
    shards = -(-rows // per_shard)
    return tuple(SourcePiece(f"{prefix}{NGRAM_TABLE}.shard_{j}.weight") for j in range(shards))


def _ngram_parts(text_config: Mapping[str, Any]) -> int:
    parts = text_config.get("split_ngram_parts", DEFAULT_NGRAM_PARTS)
    if type(parts) is not int or parts <= 0:
        raise RecipeError(
            f"text config member 'split_ngram_parts' must be a positive integer, got {parts!r}"
        )
    return parts


def _logical(spec: ParamSpec, pieces: Pieces) -> LogicalTensor:
    transpose = spec.name.endswith(_TRANSPOSED)
    return LogicalTensor(
        spec.name, spec.shape, spec.role.value, spec.inputs, pieces, transpose=transpose
    )


def _mtp_map(names: _Qwen4Names, keys: set[str], g: Qwen4ExpGeometry) -> dict[str, LogicalTensor]:
    """The MTP block of ``qwen4_exp_mtp`` with as many layers as ``mtp.layers.{i}`` holds,
    each with an indexer where the checkpoint's first layer has one."""
    layers = 1 + max((int(m[1]) for k in keys if (m := _MTP_LAYER.match(k))), default=-1)
    with_indexer = "mtp.layers.0." + INDEX_QK in keys
    out = {}
    for spec in mtp_parameters(g, layers=layers, with_indexer=with_indexer):
        if spec.name in _MTP_STEM:
            pieces = _whole(_MTP_STEM[spec.name])
        elif spec.name.startswith("mtp/final_connection/"):
            pieces = names.connection("mtp." + _FINAL_MIXER, spec.name.rsplit("/", 1)[1])
        else:
            _, _, index, suffix = spec.name.split("/", 3)  # mtp/layers/{i}/<suffix>
            pieces = names.layer(f"mtp.layers.{index}.", suffix)
        out[spec.name] = _logical(spec, pieces)
    read = {p.tensor for t in out.values() for p in t.pieces}
    unread = sorted(
        k for k in keys if k.startswith("mtp.") and k not in read and not _ENCODING_FIELD.search(k)
    )
    if unread:
        raise RecipeError(
            f"{unread[0]}: not part of the Qwen4Exp MTP layout this converter reads "
            "(mtp.fc, mtp.pre_fc_norm_*, mtp.layers.N.<decoder layer>, mtp.hyper_connection_mixer)"
        )
    return out


@register_adapter(
    dict.fromkeys(MODEL_TYPES, Architecture(ARCHITECTURE, MTP_ARCHITECTURE)),
)
def map_qwen4_exp(
    keys: set[str],
    text_config: Mapping[str, Any],
    components: tuple[str, ...],
    vision_config: Mapping[str, Any] | None = None,
) -> dict[str, LogicalTensor]:
    unsupported = sorted(set(components) - {"text", "mtp", "vision"})
    if unsupported:
        raise RecipeError(
            f"Qwen4Exp converts the text, mtp and vision components only, not"
            f" {', '.join(unsupported)}"
        )
    with_mtp = "mtp" in components
    geometry = Qwen4ExpGeometry.from_config(text_config, with_mtp=with_mtp)
    names = _Qwen4Names(keys, geometry)  # type: ignore[arg-type]  (duck-typed geometry)
    parts = _ngram_parts(text_config) if geometry.ple is not None else DEFAULT_NGRAM_PARTS
    selected = ("text", "vision") if "vision" in components else ("text",)
    specs = expected_parameters(text_config, components=selected, vision_config=vision_config)
    out: dict[str, LogicalTensor] = {}
    vision: dict[str, LogicalTensor] = {}
    for spec in specs:
        component, rest = spec.name.split("/", 1)
        if component == "vision":
            assert vision_config is not None  # expected_parameters requires it for vision
            pieces = _vision_pieces(rest, int(vision_config["hidden_size"]))
            vision[spec.name] = _logical(spec, pieces)
            continue
        if rest.endswith("/ple/ngram_table"):
            prefix = f"{names.text}layers.{rest.split('/')[1]}."
            pieces = ngram_table_pieces(keys, prefix, spec.shape[0], parts)
        elif rest.startswith("layers/"):
            _, index, suffix = rest.split("/", 2)
            pieces = names.layer(f"{names.text}layers.{index}.", suffix)
        else:
            pieces = names.globals(rest)
        out[spec.name] = _logical(spec, pieces)
    if with_mtp:
        out.update(_mtp_map(names, keys, geometry))
    out.update(vision)
    return out
