"""A tiny random GLM5Next checkpoint built with transformers, for converter and runtime tests.

``build_tiny_glm5_next(directory)`` saves ``Glm5NextForConditionalGeneration`` (a one-block
vision tower included, as the released checkpoints carry one) through ``save_pretrained``, so
the files use the released tensor names, adds a random MTP block as layer ``num_hidden_layers``
(the layout ``ninfer_convert.adapters.glm5_next`` reads) and a small tokenizer. The default
text config has one layer of each kind: KDA with a dense MLP, MLA running its own DSA indexer
with MoE, and MLA sharing that indexer with MoE; sizes let every weight format encode them
(NVFP4 rows a multiple of 128, grouped formats' columns a multiple of 64).

``convert(recipe, directory, output, **sources)`` converts it (``sources`` adds roles such as
``nvidia=...``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tests.tiny_checkpoints import write_tokenizer

TEXT: dict[str, Any] = dict(
    vocab_size=512, hidden_size=128, intermediate_size=128, moe_intermediate_size=128,
    num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2, n_shared_experts=1,
    n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
    kv_lora_rank=64, q_lora_rank=64, qk_rope_head_dim=0, qk_nope_head_dim=32, v_head_dim=32,
    index_topk=8, index_head_dim=32, index_n_heads=2, index_kpool=4,
    linear_num_heads=2, linear_head_dim=32, linear_conv_kernel_dim=4,
    hc_mult=2, hc_sinkhorn_iters=4, rms_norm_eps=1e-6, max_position_embeddings=4096,
    pad_token_id=None, tie_word_embeddings=False,
    layer_types=["linear_attention", "indexed_attention", "indexed_attention"],
    indexer_types=["full", "full", "shared"],
    mlp_layer_types=["dense", "sparse", "sparse"],
)  # fmt: skip
VISION: dict[str, Any] = dict(
    depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=128,
    projection_intermediate_size=32,
)  # fmt: skip
TEXT_PREFIX = "model.language_model."
LINEAR = "linear_attention"


def randomize(model: torch.nn.Module, scale: float = 0.6) -> None:
    """Draws far from transformers' init (zero biases, unit norms), so a mapping mistake
    changes values and the logits are far from flat."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "A_log":
                p.copy_(torch.empty_like(p).uniform_(1, 16).log())
            elif leaf in ("dt_bias", "e_score_correction_bias", "base"):
                p.normal_(0, 0.5)
            elif leaf == "scale":
                p.uniform_(0.5, 1.5)
            elif "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif "conv1d" in name or "compress_ape" in name:
                p.normal_(0, 0.4)
            elif "embed_tokens" in name:
                p.normal_()
            elif p.dim() >= 2:
                p.normal_(0, scale / p.shape[-1] ** 0.5)
            else:
                p.normal_(0, 0.3)


def build_model(
    seed: int = 0, vision: dict[str, Any] | None = None, **overrides: Any
) -> torch.nn.Module:
    """The random transformers model (text config ``TEXT`` with ``overrides``, vision config
    ``vision`` or ``VISION``), fp32, eval."""
    from transformers import Glm5NextConfig
    from transformers.models.glm5_next.modeling_glm5_next import (
        Glm5NextForConditionalGeneration,
    )

    torch.manual_seed(seed)
    config = Glm5NextConfig(text_config={**TEXT, **overrides}, vision_config=vision or VISION)
    model = Glm5NextForConditionalGeneration(config)
    randomize(model)
    return model.eval()


def build_tiny_glm5_next(
    directory: Path,
    *,
    mtp: bool = True,
    seed: int = 0,
    vision: dict[str, Any] | None = None,
    **overrides: Any,
) -> Path:
    """Save the checkpoint (fp32 weights, released names) with an MTP block and a tokenizer;
    ``overrides`` change members of the text config, ``vision`` replaces ``VISION``."""
    directory = Path(directory)
    model = build_model(seed, vision, **overrides)
    model.save_pretrained(directory)
    if mtp:
        add_mtp(directory, model.config.text_config)
    write_tokenizer(directory, model.config.text_config.vocab_size)
    processor = processor_config(vision or VISION)
    (directory / "preprocessor_config.json").write_text(json.dumps(processor))
    return directory


def processor_config(vision: dict[str, Any]) -> dict[str, Any]:
    """GLM5Next's image processor for the tower ``vision`` (transformers' defaults otherwise:
    OpenAI CLIP mean and std, a budget of 16 to 8000 merged tokens an image)."""
    return {
        "image_processor_type": "Glm5NextImageProcessor",
        "patch_size": vision.get("patch_size", 14),
        "temporal_patch_size": vision.get("temporal_patch_size", 2),
        "merge_size": vision.get("spatial_merge_size", 2),
    }


def add_mtp(directory: Path, text: Any) -> None:
    """Layer ``num_hidden_layers``: the stem (``eh_proj``, ``enorm``, ``hnorm``,
    ``shared_head.norm``) and a decoder layer made of perturbed copies of the first MLA layer
    with its own indexer (hyper-connections, attention, indexer, norms) and of the first MoE."""
    path = directory / "model.safetensors"
    tensors = load_file(path)
    kinds = list(zip(text.layer_types, text.indexer_types, text.mlp_layer_types, strict=True))
    indexed = next(i for i, (t, x, _) in enumerate(kinds) if t != LINEAR and x == "full")
    sparse = next(i for i, (_, _, m) in enumerate(kinds) if m == "sparse")
    mtp = f"{TEXT_PREFIX}layers.{text.num_hidden_layers}."
    for index, keep in ((indexed, lambda s: not s.startswith("mlp.")), (sparse, _is_mlp)):
        prefix = f"{TEXT_PREFIX}layers.{index}."
        for name, value in list(tensors.items()):
            if name.startswith(prefix) and keep(name[len(prefix) :]):
                tensors[mtp + name[len(prefix) :]] = value + 0.05 * torch.randn_like(value)
    hidden = text.hidden_size
    tensors[mtp + "eh_proj.weight"] = torch.randn(hidden, 2 * hidden) * (0.6 / (2 * hidden) ** 0.5)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        tensors[f"{mtp}{norm}.weight"] = 1 + 0.3 * torch.randn(hidden)
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})


def _is_mlp(suffix: str) -> bool:
    return suffix.startswith("mlp.")


def convert(recipe: str, directory: Path, output: Path, **sources: str) -> Any:
    """Convert ``directory`` with ``recipe``; returns the conversion report."""
    from ninfer_convert.pipeline import convert as run

    return run(recipe, {"base": str(directory), **sources}, output)
