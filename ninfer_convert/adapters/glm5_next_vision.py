"""GLM5Next's vision tower (``model.visual.*`` of ``Glm5NextForConditionalGeneration``) ->
the ``vision/`` parameters of ``ninfer_format.binders.glm5_next_vision``.

Every tensor is read whole and flat, except the fused ``attn.qkv`` weight and bias, whose rows
are ``[query | key | value]`` (each h wide, all heads together) and split into thirds as
Qwen3.5's are. The Conv3d patch embedding ``[h, 3, pt, ps, ps]`` and the Conv2d downsample
``[o, h, m, m]`` are their flat rows ``[h, 3·pt·ps·ps]`` and ``[o, h·m·m]``.
"""

from __future__ import annotations

from .base import SourcePiece
from .qwen3_5 import _vision_pieces

#: logical suffix after ``vision/`` -> HF name suffix, outside the blocks
_GLOBALS = {
    "patch_embedding": "patch_embed.proj.weight",
    "patch_embedding_bias": "patch_embed.proj.bias",
    "post_norm": "post_layernorm.weight",
    "downsample": "downsample.weight",
    "downsample_bias": "downsample.bias",
    "merger/projection": "merger.proj.weight",
    "merger/norm_weight": "merger.post_projection_norm.weight",
    "merger/norm_bias": "merger.post_projection_norm.bias",
    "merger/gate": "merger.gate_proj.weight",
    "merger/up": "merger.up_proj.weight",
    "merger/down": "merger.down_proj.weight",
}
#: per block (``vision/layers/{i}/`` -> ``model.visual.blocks.{i}.``), except query/key/value
_BLOCK = {
    "norm1_weight": "norm1.weight",
    "norm2_weight": "norm2.weight",
    "attention/query_norm": "attn.q_norm.weight",
    "attention/key_norm": "attn.k_norm.weight",
    "attention/output": "attn.proj.weight",
    "attention/output_bias": "attn.proj.bias",
    **{
        f"mlp/{p}{bias}": f"mlp.{p}_proj.{'bias' if bias else 'weight'}"
        for p in ("gate", "up", "down")
        for bias in ("", "_bias")
    },
}


def vision_pieces(suffix: str, hidden: int) -> tuple[SourcePiece, ...]:
    """``suffix``: the logical name after ``vision/``; ``hidden``: the vision width h."""
    return _vision_pieces(suffix, hidden, _GLOBALS, _BLOCK)
