"""The text configs (spec 5.1) ``ninfer-bench synth`` builds: official geometries, tiny ones.

Kept apart from :mod:`.synthetic` so the command line can list them without importing the
converter (and torch). Each config is read by its architecture's geometry class in
``ninfer_format.binders`` (``architecture_of``); nothing here parses a config itself.

Where the official numbers come from:

* ``qwen3_6_*``: the Qwen3.6 checkpoints' ``config.json``;
* ``qwen3_8_flash_next`` (Qwen4Exp): the published ``text_config`` of Qwen3.8-Flash-Next
  (hidden 2560, 48 layers of three GDN and one QSA layer, 512 experts of width 640 with 10
  chosen and one shared, GQA 24/2 of 256, GDN 16 key and 48 value heads of 128, four
  hyper-connection streams of rank 320, QSA 4 indexer heads of 128 keeping 2048 tokens in
  blocks of 4) and its n-gram table (one PLE layer, decoder layer 1, 16 hash heads over
  primes from 2·10^7: 320,001,536 rows of 160 = 51 B parameters); the vocabulary is the
  Qwen3.5 family's 248320;
* ``glm5next`` (GLM5Next, GLM-5.3-Flash): transformers' ``Glm5NextTextConfig`` defaults,
  which are the released checkpoint's numbers (45 layers, hidden 4096, KDA on 34 layers and
  MLA with its DSA indexer on every fourth, 3 dense FFNs then 288 experts of 2048 with 8
  chosen and one shared).
"""

from __future__ import annotations

from typing import Any

from ninfer_format.binders.glm5_next_geometry import TEXT as GLM5_NEXT
from ninfer_format.binders.qwen3_5_geometry import (
    DENSE,
    MOE,
    Qwen35Geometry,
    layer_types_for_interval,
)
from ninfer_format.binders.qwen4_exp_geometry import TEXT as QWEN4_EXP

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
    "qwen3_8_flash_next": _config(
        QWEN4_EXP, 48, [11, 11, 10],
        vocab_size=248320, hidden_size=2560, eos_token_id=248044,
        num_attention_heads=24, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=48, **_GDN_128,
        num_experts=512, num_experts_per_tok=10,
        moe_intermediate_size=640, shared_expert_intermediate_size=640,
        hc_count=4, hc_lowrank=320,
        ple_layer_ids=[2], ngram_size=3, heads_per_ngram=8,
        ngram_vocab_size_base=20_000_000, make_ngram_vocab_size_divisible_by=128,
        indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=128,
        indexer_budget=2048, indexer_compress_ratio=4,
    ),
    "glm5next": {
        "model_type": GLM5_NEXT, "num_hidden_layers": 45, "vocab_size": 154880,
        "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 2048,
        "n_routed_experts": 288, "num_experts_per_tok": 8, "n_shared_experts": 1,
        "num_attention_heads": 64, "num_key_value_heads": 64,
        "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 256, "qk_rope_head_dim": 0, "v_head_dim": 256,
        "linear_num_heads": 64, "linear_head_dim": 128, "hc_mult": 4,
        "max_position_embeddings": 1048576,
    },
    "tiny_dense": _config(DENSE, 4, [4, 2, 2], intermediate_size=256, **TINY_SHAPES),
    "tiny_moe": _config(
        MOE, 4, [4, 2, 2],
        num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=128, shared_expert_intermediate_size=128, **TINY_SHAPES,
    ),
    "tiny_qwen4_exp": _config(
        QWEN4_EXP, 8, [4, 2, 2], eos_token_id=258,
        num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=128, shared_expert_intermediate_size=128,
        hc_count=2, hc_lowrank=16, ple_layer_ids=[2], ngram_size=3, heads_per_ngram=2,
        ngram_vocab_size_base=1000, indexer_n_heads=2, indexer_kv_heads=1,
        indexer_head_dim=64, indexer_budget=16, indexer_compress_ratio=4, **TINY_SHAPES,
    ),
    "tiny_glm5_next": {
        "model_type": GLM5_NEXT, "num_hidden_layers": 8, "vocab_size": 512,
        "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 128,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 64, "kv_lora_rank": 64,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 0, "v_head_dim": 32,
        "index_topk": 8, "index_head_dim": 32, "index_n_heads": 2, "index_kpool": 4,
        "linear_num_heads": 2, "linear_head_dim": 32, "hc_mult": 2, "hc_sinkhorn_iters": 4,
        "max_position_embeddings": 4096, "pad_token_id": None,
    },
}  # fmt: skip


def geometry(name: str) -> Qwen35Geometry:
    """The geometry of ``GEOMETRIES[name]``, as the binder and the runtime read it."""
    return Qwen35Geometry.from_config(GEOMETRIES[name])
