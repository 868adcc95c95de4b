"""GLM5Next checkpoints (HF names) -> the logical parameters of the GLM5Next binder
(``ninfer_format.binders.glm5_next``).

Both text prefixes: ``model.language_model.`` (``Glm5NextForConditionalGeneration``, the only
head class transformers has) and ``model.`` (a flat text-only checkpoint). Both spellings of
the blocks transformers renames when it loads (``conversion_mapping``), so a released
checkpoint and ``save_pretrained`` output (which writes the released names back) read the same
as a raw ``state_dict``: hyper-connections ``hc_attn_fn|base|scale`` or ``attn_hc.fn|…``,
the KDA forget gate on ``self_attn`` or ``self_attn.forget_gate``, the KDA short convolutions
``q|k|v_conv1d`` ``[W, 1, T]`` each or one ``conv1d`` ``[3W, 1, T]`` (either way read as
``[q | k | v]`` and transposed to ``[T, 3W]``), routed experts per expert or fused
(``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``). MLA's ``kv_b_proj`` rows are per head
``[key_h (nope rows) | value_h (v rows)]`` and split by head into ``key_up`` and ``value_up``.

The vision tower (``model.visual.*``) maps when the vision component is selected (names in
``glm5_next_vision``, the contract in ``ninfer_format.binders.glm5_next_vision``).

MTP: transformers defines no GLM5Next MTP block (it ignores the checkpoint's
``layers.{num_hidden_layers}``); the binder's ``mtp`` parameters follow DeepSeek-V3's layout
(whose ``shared_head`` transformers' ignore list names). Layer ``N = num_hidden_layers`` holds
the stem ``eh_proj [H, 2H]`` -> ``mtp/input_projection``, ``enorm`` -> ``mtp/embedding_norm``,
``hnorm`` -> ``mtp/hidden_norm``, ``shared_head.norm`` -> ``mtp/final_norm``, and one decoder
layer (hyper-connections, MLA with its own indexer, MoE) read as ``mtp/layers/0/…`` under the
text layers' names. Its copies of the embedding and the output head (``embed_tokens``,
``shared_head.head``), when present, are the text ones and are not read; any other tensor of
layer N is an error naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ninfer_format.binders.glm5_next import MTP_ARCHITECTURE, MTP_LAYER, expected_parameters
from ninfer_format.binders.glm5_next_geometry import (
    ARCHITECTURE,
    DEFAULTS,
    MODEL_TYPES,
    Glm5NextGeometry,
)
from ninfer_format.binders.parameter_spec import ParamSpec

from ..errors import RecipeError
from .base import Architecture, LogicalTensor, SourcePiece, register_adapter
from .glm5_next_vision import vision_pieces
from .qwen3_5 import Pieces, _rows, _whole

__all__ = ["map_glm5_next"]

PREFIXES = ("model.language_model.", "model.")

#: per layer, logical suffix -> HF name suffixes: the released spelling first, then
#: transformers' in-memory one (the first present is read; a missing one is named as released)
_LAYER: dict[str, tuple[str, ...]] = {
    "input_norm": ("input_layernorm.weight",),
    "post_attention_norm": ("post_attention_layernorm.weight",),
    "mixer_connection/projection": ("hc_attn_fn", "attn_hc.fn"),
    "mixer_connection/bias": ("hc_attn_base", "attn_hc.base"),
    "mixer_connection/scale": ("hc_attn_scale", "attn_hc.scale"),
    "ffn_connection/projection": ("hc_ffn_fn", "ffn_hc.fn"),
    "ffn_connection/bias": ("hc_ffn_base", "ffn_hc.base"),
    "ffn_connection/scale": ("hc_ffn_scale", "ffn_hc.scale"),
    "kda/query": ("self_attn.q_proj.weight",),
    "kda/key": ("self_attn.k_proj.weight",),
    "kda/value": ("self_attn.v_proj.weight",),
    "kda/forget_down": ("self_attn.f_a_proj.weight", "self_attn.forget_gate.f_a_proj.weight"),
    "kda/forget_up": ("self_attn.f_b_proj.weight", "self_attn.forget_gate.f_b_proj.weight"),
    "kda/dt_bias": ("self_attn.dt_bias", "self_attn.forget_gate.dt_bias"),
    "kda/a_log": ("self_attn.A_log", "self_attn.forget_gate.A_log"),
    "kda/b_projection": ("self_attn.b_proj.weight",),
    "kda/gate_down": ("self_attn.g_a_proj.weight",),
    "kda/gate_up": ("self_attn.g_b_proj.weight",),
    "kda/norm": ("self_attn.o_norm.weight",),
    "kda/output": ("self_attn.o_proj.weight",),
    "mla/query_down": ("self_attn.q_a_proj.weight",),
    "mla/query_norm": ("self_attn.q_a_layernorm.weight",),
    "mla/query_up": ("self_attn.q_b_proj.weight",),
    "mla/kv_down": ("self_attn.kv_a_proj_with_mqa.weight",),
    "mla/kv_norm": ("self_attn.kv_a_layernorm.weight",),
    "mla/output": ("self_attn.o_proj.weight",),
    "indexer/query": ("self_attn.indexer.wq_b.weight",),
    "indexer/key": ("self_attn.indexer.wk.weight",),
    "indexer/key_norm": ("self_attn.indexer.k_norm.weight",),
    "indexer/key_norm_bias": ("self_attn.indexer.k_norm.bias",),
    "indexer/head_weights": ("self_attn.indexer.weights_proj.weight",),
    "indexer/pool_gate": ("self_attn.indexer.index_kpool_compress_gate",),
    "indexer/pool_position": ("self_attn.indexer.index_kpool_compress_ape",),
    "mlp/gate": ("mlp.gate_proj.weight",),
    "mlp/up": ("mlp.up_proj.weight",),
    "mlp/down": ("mlp.down_proj.weight",),
    "moe/router": ("mlp.gate.weight",),
    "moe/router_bias": ("mlp.gate.e_score_correction_bias",),
    "moe/shared/gate": ("mlp.shared_experts.gate_proj.weight",),
    "moe/shared/up": ("mlp.shared_experts.up_proj.weight",),
    "moe/shared/down": ("mlp.shared_experts.down_proj.weight",),
}
#: the KDA short convolutions: released (one per projection) and fused
_CONVOLUTIONS = tuple(f"self_attn.{x}_conv1d.weight" for x in "qkv")
_FUSED_CONVOLUTION = "self_attn.conv1d.weight"
#: the MTP stem (layer N): logical name -> HF name suffix
_MTP_STEM = {
    "mtp/input_projection": "eh_proj.weight",
    "mtp/embedding_norm": "enorm.weight",
    "mtp/hidden_norm": "hnorm.weight",
    "mtp/final_norm": "shared_head.norm.weight",
}
#: layer-N copies of text parameters, not read
_MTP_COPIES = ("embed_tokens.weight", "shared_head.head.weight")


def text_prefix(keys: set[str]) -> str:
    found = (p for p in PREFIXES if any(k.startswith(p + "layers.") for k in keys))
    return next(found, PREFIXES[0])


def mtp_layer_index(text_config: Mapping[str, Any]) -> int | None:
    """The checkpoint layer that holds the MTP block (``num_hidden_layers``), if readable."""
    layers = text_config.get("num_hidden_layers", DEFAULTS["num_hidden_layers"])
    return layers if type(layers) is int and layers >= 0 else None


def has_mtp(keys: set[str], text_config: Mapping[str, Any]) -> bool:
    """Whether layer ``num_hidden_layers`` has an MTP stem (plain or quantized fields)."""
    index = mtp_layer_index(text_config)
    stem = f"{text_prefix(keys)}layers.{index}.eh_proj.weight"
    return index is not None and any(k.startswith(stem) for k in keys)


class _Names:
    """Source names for one checkpoint: prefix found once, lookups by logical suffix."""

    def __init__(self, keys: set[str], geometry: Glm5NextGeometry):
        self.keys = keys
        self.text = text_prefix(keys)
        self.geometry = geometry

    def globals(self, suffix: str) -> Pieces:
        embedding = self.text + "embed_tokens.weight"
        if suffix == "token_embedding":
            return _whole(embedding)
        if suffix == "final_norm":
            return _whole(self.text + "norm.weight")
        if "lm_head.weight" not in self.keys and self.geometry.tie_word_embeddings:
            return _whole(embedding)
        return _whole("lm_head.weight")

    def _present(self, prefix: str, candidates: tuple[str, ...]) -> str:
        found = (prefix + c for c in candidates if prefix + c in self.keys)
        return next(found, prefix + candidates[0])

    def layer(self, prefix: str, suffix: str) -> Pieces:
        """``prefix`` is the HF layer prefix (``model.language_model.layers.3.``)."""
        if suffix in _LAYER:
            return _whole(self._present(prefix, _LAYER[suffix]))
        if suffix == "kda/convolution":
            if prefix + _FUSED_CONVOLUTION in self.keys:
                return _whole(prefix + _FUSED_CONVOLUTION)
            return tuple(SourcePiece(prefix + c) for c in _CONVOLUTIONS)
        if suffix in ("mla/key_up", "mla/value_up"):
            return self._key_or_value(prefix + "self_attn.kv_b_proj.weight", suffix)
        if suffix.startswith("moe/experts/"):
            _, _, e, which = suffix.split("/")
            return self._expert(prefix, int(e), which)
        raise RecipeError(f"no source mapping for {prefix}{suffix}")

    def _key_or_value(self, name: str, suffix: str) -> Pieces:
        mla = self.geometry.mla
        assert mla is not None  # the parameter exists because a block is MLA
        nope, v = mla.nope_dim, mla.value_dim
        start, width = (0, nope) if suffix == "mla/key_up" else (nope, v)
        step = nope + v
        return tuple(
            SourcePiece(name, (h * step + start, h * step + start + width))
            for h in range(mla.heads)
        )

    def _expert(self, prefix: str, e: int, which: str) -> Pieces:
        per_expert = f"{prefix}mlp.experts.{e}.{which}_proj.weight"
        fused = f"{prefix}mlp.experts.{'down' if which == 'down' else 'gate_up'}_proj"
        if per_expert in self.keys or fused not in self.keys:
            return _whole(per_expert)
        moe = self.geometry.moe
        assert moe is not None  # the parameter exists because a layer is sparse
        if which == "down":
            hidden = self.geometry.hidden
            return _rows(fused, e * hidden, (e + 1) * hidden)
        width = moe.expert_width
        start = e * 2 * width + (0 if which == "gate" else width)
        return _rows(fused, start, start + width)


def _mtp_pieces(names: _Names, prefix: str, name: str) -> Pieces:
    if name in _MTP_STEM:
        return _whole(prefix + _MTP_STEM[name])
    return names.layer(prefix, name.removeprefix(MTP_LAYER))


def _check_mtp_layer(keys: set[str], prefix: str, read: set[str]) -> None:
    """Every tensor of the MTP layer is read, a field of one read (``P.weight_scale``,
    ``P.input_scale``, … of a quantized ``P.weight``) or a known copy: any other means the
    checkpoint's MTP block is not the layout this adapter reads."""
    modules = {t.removesuffix("weight") for t in read if t.endswith(".weight")}
    unread = sorted(
        k
        for k in keys
        if k.startswith(prefix)
        and k not in read
        and k.rsplit(".", 1)[0] + "." not in modules
        and k.removeprefix(prefix) not in _MTP_COPIES
    )
    if unread:
        more = f" and {len(unread) - 1} more" if len(unread) > 1 else ""
        raise RecipeError(
            f"{unread[0]}{more}: not part of the GLM5Next MTP layout this converter reads "
            "(stem eh_proj/enorm/hnorm/shared_head.norm and one MLA + indexer + MoE layer)"
        )


def _logical(spec: ParamSpec, pieces: Pieces) -> LogicalTensor:
    return LogicalTensor(
        spec.name,
        spec.shape,
        spec.role.value,
        spec.inputs,
        pieces,
        transpose=spec.name.endswith("kda/convolution"),
    )


@register_adapter(
    dict.fromkeys(MODEL_TYPES, Architecture(ARCHITECTURE, MTP_ARCHITECTURE)),
    has_mtp=has_mtp,
)
def map_glm5_next(
    keys: set[str],
    text_config: Mapping[str, Any],
    components: tuple[str, ...],
    vision_config: Mapping[str, Any] | None = None,
) -> dict[str, LogicalTensor]:
    with_mtp = "mtp" in components
    geometry = Glm5NextGeometry.from_config(text_config, with_mtp=with_mtp)
    names = _Names(keys, geometry)
    mtp_prefix = f"{names.text}layers.{geometry.layers}."
    selected = [c for c in ("text", "mtp", "vision") if c == "text" or c in components]
    specs = expected_parameters(text_config, components=selected, vision_config=vision_config)
    out: dict[str, LogicalTensor] = {}
    for spec in specs:
        component, rest = spec.name.split("/", 1)
        if component == "vision":
            assert vision_config is not None  # expected_parameters requires it for vision
            pieces = vision_pieces(rest, int(vision_config["hidden_size"]))
        elif component == "mtp":
            pieces = _mtp_pieces(names, mtp_prefix, spec.name)
        elif rest.startswith("layers/"):
            _, index, suffix = rest.split("/", 2)
            pieces = names.layer(f"{names.text}layers.{index}.", suffix)
        else:
            pieces = names.globals(rest)
        out[spec.name] = _logical(spec, pieces)
    if with_mtp:
        read = {p.tensor for name, t in out.items() if name.startswith("mtp/") for p in t.pieces}
        _check_mtp_layer(keys, mtp_prefix, read)
    return out
