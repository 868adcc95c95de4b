"""Shared pieces of the Qwen4Exp module tests: a tiny transformers config, its geometry,
random weights for a transformers submodule, and numpy copies of them.

Weights are drawn N(0, 0.2) for every parameter (norm weights included, so the ``1 + w``
scales differ from one), which transformers' own initialisation would leave at zero.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_format.binders.qwen4_exp_geometry import Qwen4ExpGeometry

EOS = 5


def tiny_config(**overrides: Any) -> Any:
    """Two GDN layers (PLE on the first, one-indexed 1) and two QSA attention layers; the
    indexer keeps 2 blocks of 4 tokens, so prompts past 8 tokens select."""
    from transformers import Qwen4ExpTextConfig

    members: dict[str, Any] = dict(
        vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
        moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=4,
        num_experts_per_tok=2, hc_count=3, hc_lowrank=8, ple_layer_ids=[1], ple_embed_dim=16,
        ngram_size=3, heads_per_ngram=2, ngram_vocab_size_base=97,
        make_ngram_vocab_size_divisible_by=8, indexer_n_heads=2, indexer_kv_heads=1,
        indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=4, eos_token_id=EOS,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1]},
        layer_types=["linear_attention", "indexed_attention"] * 2,
    )  # fmt: skip
    members.update(overrides)
    return Qwen4ExpTextConfig(**members)


def geometry(config: Any) -> Qwen4ExpGeometry:
    return Qwen4ExpGeometry.from_config(config.to_dict())


def randomized(module: Any, seed: int) -> Any:
    """``module`` in float32 eval mode with every parameter drawn N(0, 0.2)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    module = module.float().eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.2)
    return module


def array(t: Any) -> np.ndarray:
    return t.detach().float().numpy().copy()


def relative_error(ours: np.ndarray, theirs: np.ndarray) -> float:
    return float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-12))
