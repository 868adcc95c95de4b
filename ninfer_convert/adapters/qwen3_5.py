"""Qwen3.5 / Qwen3.6 dense and MoE checkpoints (HF names) -> v3 logical parameters (spec 5).

Handles both prefixes of real checkpoints (text-only ``model.`` and VLM
``model.language_model.``), MoE experts stored per expert or fused (``experts.gate_up_proj``
``[E, 2I, H]``, ``experts.down_proj`` ``[E, H, I]``), the per-head query/gate interleave of
``q_proj``, the ``in_proj_qkv`` row split and the GDN convolution transpose. A VLM
checkpoint's vision tower (``model.visual.*``, spec 5.4) maps when the vision component is
selected: the fused ``attn.qkv`` weight and bias split by rows into query/key/value thirds, and
the ``[h, 3, pt, ps, ps]`` patch convolution is read flat as ``[h, 3·pt·ps·ps]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ninfer_format.binders.qwen3_5 import ARCHITECTURE_OF, MTP_ARCHITECTURE_OF, expected_parameters
from ninfer_format.binders.qwen3_5_geometry import Qwen35Geometry

from ..errors import RecipeError
from .base import Architecture, LogicalTensor, SourcePiece, register_adapter

Pieces = tuple[SourcePiece, ...]


def _whole(name: str) -> Pieces:
    return (SourcePiece(name),)


def _rows(name: str, start: int, stop: int) -> Pieces:
    return (SourcePiece(name, (start, stop)),)


class _Names:
    """Source names for one checkpoint: prefixes found once, lookups by logical suffix."""

    def __init__(self, keys: set[str], geometry: Qwen35Geometry):
        self.keys = keys
        self.text = (
            "model.language_model."
            if any(k.startswith("model.language_model.") for k in keys)
            else "model."
        )
        self.geometry = geometry

    def globals(self, suffix: str) -> Pieces:
        if suffix == "token_embedding":
            return _whole(self.text + "embed_tokens.weight")
        if suffix == "final_norm":
            return _whole(self.text + "norm.weight")
        if "lm_head.weight" not in self.keys and self.geometry.tie_word_embeddings:
            return _whole(self.text + "embed_tokens.weight")
        return _whole("lm_head.weight")

    def layer(self, prefix: str, suffix: str) -> Pieces:
        """``prefix`` is the HF layer prefix (``model.layers.3.`` or ``mtp.layers.0.``)."""
        simple = {
            "input_norm": "input_layernorm.weight",
            "post_attention_norm": "post_attention_layernorm.weight",
            "attention/key": "self_attn.k_proj.weight",
            "attention/value": "self_attn.v_proj.weight",
            "attention/output": "self_attn.o_proj.weight",
            "attention/query_norm": "self_attn.q_norm.weight",
            "attention/key_norm": "self_attn.k_norm.weight",
            "gdn/z": "linear_attn.in_proj_z.weight",
            "gdn/a_projection": "linear_attn.in_proj_a.weight",
            "gdn/b_projection": "linear_attn.in_proj_b.weight",
            "gdn/a_log": "linear_attn.A_log",
            "gdn/dt_bias": "linear_attn.dt_bias",
            "gdn/norm": "linear_attn.norm.weight",
            "gdn/output": "linear_attn.out_proj.weight",
            "gdn/convolution": "linear_attn.conv1d.weight",
            "mlp/gate": "mlp.gate_proj.weight",
            "mlp/up": "mlp.up_proj.weight",
            "mlp/down": "mlp.down_proj.weight",
            "moe/router": "mlp.gate.weight",
            "moe/shared_score": "mlp.shared_expert_gate.weight",
            "moe/shared/gate": "mlp.shared_expert.gate_proj.weight",
            "moe/shared/up": "mlp.shared_expert.up_proj.weight",
            "moe/shared/down": "mlp.shared_expert.down_proj.weight",
        }
        if suffix in simple:
            return _whole(prefix + simple[suffix])
        if suffix in ("attention/query", "attention/gate"):
            return self._query_or_gate(prefix + "self_attn.q_proj.weight", suffix)
        if suffix.startswith("gdn/") and suffix[4:] in ("query", "key", "value"):
            gdn = self.geometry.gdn
            assert gdn is not None  # the parameter exists because a layer is a GDN layer
            kg, vg = gdn.key_width, gdn.value_width
            start, width = {"query": (0, kg), "key": (kg, kg), "value": (2 * kg, vg)}[suffix[4:]]
            return _rows(prefix + "linear_attn.in_proj_qkv.weight", start, start + width)
        if suffix.startswith("moe/experts/"):
            _, _, e, which = suffix.split("/")
            return self._expert(prefix, int(e), which)
        raise RecipeError(f"no source mapping for {prefix}{suffix}")

    def _query_or_gate(self, name: str, suffix: str) -> Pieces:
        attention = self.geometry.attention
        assert attention is not None  # the parameter exists because a block is attention
        d, heads = attention.head_dim, attention.heads
        offset = 0 if suffix == "attention/query" else d
        return tuple(
            SourcePiece(name, (2 * h * d + offset, 2 * h * d + offset + d)) for h in range(heads)
        )

    def _expert(self, prefix: str, e: int, which: str) -> Pieces:
        per_expert = f"{prefix}mlp.experts.{e}.{which}_proj.weight"
        if per_expert in self.keys:
            return _whole(per_expert)
        moe = self.geometry.moe
        assert moe is not None  # the parameter exists because the model is MoE
        width = moe.expert_width
        if which == "down":
            hidden = self.geometry.hidden
            return _rows(f"{prefix}mlp.experts.down_proj", e * hidden, (e + 1) * hidden)
        start = e * 2 * width + (0 if which == "gate" else width)
        return _rows(f"{prefix}mlp.experts.gate_up_proj", start, start + width)


#: HF prefix of the vision tower in VLM checkpoints (notes 4.1)
VISUAL = "model.visual."
#: vision parameters outside the blocks: logical suffix after ``vision/`` -> HF name suffix
_VISION_GLOBALS = {
    "patch_embedding": "patch_embed.proj.weight",  # Conv3d [h, 3, pt, ps, ps], read flat
    "patch_embedding_bias": "patch_embed.proj.bias",
    "position_embedding": "pos_embed.weight",
    "merger/norm_weight": "merger.norm.weight",
    "merger/norm_bias": "merger.norm.bias",
    "merger/fc1": "merger.linear_fc1.weight",
    "merger/fc1_bias": "merger.linear_fc1.bias",
    "merger/fc2": "merger.linear_fc2.weight",
    "merger/fc2_bias": "merger.linear_fc2.bias",
}
#: per block (``vision/layers/{i}/`` -> ``model.visual.blocks.{i}.``), except query/key/value
_VISION_BLOCK = {
    "norm1_weight": "norm1.weight",
    "norm1_bias": "norm1.bias",
    "norm2_weight": "norm2.weight",
    "norm2_bias": "norm2.bias",
    "attention/output": "attn.proj.weight",
    "attention/output_bias": "attn.proj.bias",
    "mlp/fc1": "mlp.linear_fc1.weight",
    "mlp/fc1_bias": "mlp.linear_fc1.bias",
    "mlp/fc2": "mlp.linear_fc2.weight",
    "mlp/fc2_bias": "mlp.linear_fc2.bias",
}
#: HF ``attn.qkv`` output rows are [query | key | value], each h wide (all heads together)
_QKV = ("query", "key", "value")


def has_vision_weights(keys: Iterable[str]) -> bool:
    return any(k.startswith(VISUAL) for k in keys)


def _vision_pieces(
    suffix: str,
    hidden: int,
    globals_: Mapping[str, str] = _VISION_GLOBALS,
    block_names: Mapping[str, str] = _VISION_BLOCK,
) -> Pieces:
    """``suffix`` is the logical name after ``vision/``; ``hidden`` the vision width h.
    ``globals_`` and ``block_names`` name a tower's tensors other than its fused ``attn.qkv``
    (Qwen3.5's by default; another tower with the same fused ``qkv`` passes its own)."""
    if suffix in globals_:
        return _whole(VISUAL + globals_[suffix])
    _, index, rest = suffix.split("/", 2)  # layers/{i}/...
    block = f"{VISUAL}blocks.{index}."
    if rest in block_names:
        return _whole(block + block_names[rest])
    projection = rest.removeprefix("attention/")
    which = projection.removesuffix("_bias")
    if which not in _QKV:
        raise RecipeError(f"no source mapping for vision/{suffix}")
    fused = block + ("attn.qkv.bias" if projection.endswith("_bias") else "attn.qkv.weight")
    start = _QKV.index(which) * hidden
    return _rows(fused, start, start + hidden)


def _mtp_pieces(names: _Names, suffix: str) -> Pieces:
    fixed = {
        "input_projection": "mtp.fc.weight",
        "embedding_norm": "mtp.pre_fc_norm_embedding.weight",
        "hidden_norm": "mtp.pre_fc_norm_hidden.weight",
        "final_norm": "mtp.norm.weight",
    }
    if suffix in fixed:
        return _whole(fixed[suffix])
    _, index, rest = suffix.split("/", 2)  # layers/0/...
    return names.layer(f"mtp.layers.{index}.", rest)


@register_adapter(
    {t: Architecture(ARCHITECTURE_OF[t], MTP_ARCHITECTURE_OF[t]) for t in ARCHITECTURE_OF}
)
def map_qwen3_5(
    keys: set[str],
    text_config: Mapping[str, Any],
    components: tuple[str, ...],
    vision_config: Mapping[str, Any] | None = None,
) -> dict[str, LogicalTensor]:
    specs = expected_parameters(text_config, components=components, vision_config=vision_config)
    names = _Names(keys, Qwen35Geometry.from_config(text_config, with_mtp="mtp" in components))
    out: dict[str, LogicalTensor] = {}
    for spec in specs:
        component, rest = spec.name.split("/", 1)
        if component == "text" and rest.startswith("layers/"):
            _, index, suffix = rest.split("/", 2)
            pieces = names.layer(f"{names.text}layers.{index}.", suffix)
        elif component == "text":
            pieces = names.globals(rest)
        elif component == "mtp":
            pieces = _mtp_pieces(names, rest)
        elif component == "vision":
            assert vision_config is not None  # expected_parameters requires it for vision
            pieces = _vision_pieces(rest, int(vision_config["hidden_size"]))
        else:
            continue  # proposal parameters are built by the pipeline, not read from a source
        out[spec.name] = LogicalTensor(
            spec.name,
            spec.shape,
            spec.role.value,
            spec.inputs,
            pieces,
            transpose=spec.name.endswith("gdn/convolution"),
        )
    return out
