"""The text configs (spec 5.1) ``ninfer-bench synth`` builds: official geometries, tiny ones.

Kept apart from :mod:`.synthetic` so the command line can list them without importing the
converter (and torch).
"""

from __future__ import annotations

from typing import Any

from ninfer_format.binders.qwen3_5_geometry import (
    DENSE,
    MOE,
    Qwen35Geometry,
    layer_types_for_interval,
)

_ROPE = {
    "rope_type": "default",
    "rope_theta": 1e7,
    "partial_rotary_factor": 0.25,
    "mrope_interleaved": True,
}


#: every fourth layer full attention, as in the official checkpoints
FULL_ATTENTION_INTERVAL = 4


def _config(model_type: str, layers: int, mrope: list[int], **fields: Any) -> dict[str, Any]:
    return {
        "model_type": model_type,
        "num_hidden_layers": layers,
        "layer_types": layer_types_for_interval(layers, FULL_ATTENTION_INTERVAL),
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "max_position_embeddings": 262144,
        "rope_parameters": {**_ROPE, "mrope_section": mrope},
        **fields,
    }


#: the shapes of the tiny test models (also built as real checkpoints by the tests)
TINY_SHAPES = dict(
    vocab_size=512,
    hidden_size=128,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
)
_GDN_128 = dict(linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4)

#: text configs (spec 5.1) of the official geometries, and tiny ones that fit every format
GEOMETRIES: dict[str, dict[str, Any]] = {
    "qwen3_6_27b": _config(
        DENSE, 64, [11, 11, 10],
        vocab_size=248320, hidden_size=5120, intermediate_size=17408,
        num_attention_heads=24, num_key_value_heads=4, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=48, **_GDN_128,
    ),
    "qwen3_6_35b_a3b": _config(
        MOE, 40, [11, 11, 10],
        vocab_size=248320, hidden_size=2048,
        num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=32, **_GDN_128,
        num_experts=256, num_experts_per_tok=8,
        moe_intermediate_size=512, shared_expert_intermediate_size=512,
    ),
    "tiny_dense": _config(DENSE, 4, [4, 2, 2], intermediate_size=256, **TINY_SHAPES),
    "tiny_moe": _config(
        MOE, 4, [4, 2, 2],
        num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=128, shared_expert_intermediate_size=128, **TINY_SHAPES,
    ),
}  # fmt: skip


def geometry(name: str) -> Qwen35Geometry:
    """The geometry of ``GEOMETRIES[name]``, as the binder and the runtime read it."""
    return Qwen35Geometry.from_config(GEOMETRIES[name])
