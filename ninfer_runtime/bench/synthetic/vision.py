"""The vision component of a synthetic Qwen3.5-family artifact (``ninfer-bench synth --vision``):
a Qwen3.5 vision tower of the released checkpoints' geometry (or a tiny one for the tiny
geometries), its image processor config and the text resources an image chat needs.

The tower's parameters come from the binder's contract (``expected_parameters`` with the
vision component selected), so they are planned, packed and encoded like a converted tower's;
their values follow ``chunks`` (LayerNorm gains ~ 1, biases ~ 0, matrices of std ~ 1/sqrt(K)),
so the tower's activations stay finite.

The engine finds the image placeholder by its token (``<|image_pad|>``, ``vision_families``),
not by a config id, so the synthetic tokenizer gains Qwen's four vision specials after its
others, and the chat template is the runtime's built-in Qwen3.5 one, which writes an image
part as ``<|vision_start|><|image_pad|><|vision_end|>``.
"""

from __future__ import annotations

import json
from typing import Any

from ninfer_format.binders import qwen3_5 as qwen35_binder
from ninfer_format.binders.qwen3_5_vision import VISION_MODEL_TYPE_OF

from ...frontend.chat_template import builtin_template_source

#: the released Qwen3.5 / Qwen3.6 checkpoints' ``vision_config`` (``out_hidden_size`` and
#: ``model_type`` are set per text model: ``vision_config``)
FULL_TOWER = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "in_channels": 3,
    "num_position_embeddings": 2304,
    "hidden_act": "gelu_pytorch_tanh",
}
#: a tower of the same structure small enough for CPU tests (the tiny VLM test tower's shape)
TINY_TOWER = {
    **FULL_TOWER,
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 80,
    "num_heads": 4,
    "patch_size": 4,
    "num_position_embeddings": 16,
}
#: the Qwen3.5 preprocessor: mean/std 0.5 (patch sizes: the tower's; ``processor_config``)
PROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
#: pixel budgets (Qwen2-VL area sizing): the released one, and the tiny VLM test's (a tiny
#: tower's 4-pixel patches under the released minimum would make any test image 4096 patches)
FULL_BUDGET = {"shortest_edge": 65536, "longest_edge": 16777216}
TINY_BUDGET = {"shortest_edge": 64, "longest_edge": 65536}
#: Qwen's vision specials, appended to the synthetic tokenizer's
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
PROCESSOR_ROLE = "preprocessor_config.json"


def is_tiny(geometry: str) -> bool:
    """The tiny test geometries get the tiny tower; every other one the full-size tower."""
    return geometry.startswith("tiny_")


def vision_config(geometry: str, text_config: dict[str, Any]) -> dict[str, Any]:
    """The vision component's config for ``text_config``'s model (Qwen3.5 dense or MoE)."""
    model_type = text_config.get("model_type")
    if model_type not in VISION_MODEL_TYPE_OF:
        raise ValueError(
            f"--vision needs a Qwen3.5/3.6 geometry (a qwen3_5 vision tower); {geometry} is "
            f"{model_type}"
        )
    return {
        **(TINY_TOWER if is_tiny(geometry) else FULL_TOWER),
        "out_hidden_size": int(text_config["hidden_size"]),
        "model_type": VISION_MODEL_TYPE_OF[model_type],
    }


def vision_parameters(text_config: dict[str, Any], config: dict[str, Any]) -> list[Any]:
    """The tower's parameter specs (``vision/*``) from the binder's contract."""
    specs = qwen35_binder.expected_parameters(
        text_config, components=("vision",), vision_config=config
    )
    return [s for s in specs if s.name.startswith("vision/")]


def processor_config(geometry: str, config: dict[str, Any]) -> dict[str, Any]:
    """``preprocessor_config.json`` whose patch sizes are the tower's (spec 5.7)."""
    return {
        **PROCESSOR,
        "size": TINY_BUDGET if is_tiny(geometry) else FULL_BUDGET,
        "patch_size": config["patch_size"],
        "temporal_patch_size": config["temporal_patch_size"],
        "merge_size": config["spatial_merge_size"],
    }


def vision_resources(geometry: str, config: dict[str, Any]) -> dict[str, bytes]:
    """The vision component's resources by role."""
    return {PROCESSOR_ROLE: json.dumps(processor_config(geometry, config), indent=2).encode()}


def chat_template() -> str:
    """The built-in Qwen3.5 template (image parts as Qwen's vision tokens)."""
    return builtin_template_source()
