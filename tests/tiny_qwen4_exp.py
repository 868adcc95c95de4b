"""Tiny random Qwen4Exp ("Qwen3.8-Flash-Next") checkpoints built with transformers, for
converter and runtime tests.

Four layers: GDN with PLE, indexed attention, GDN with PLE (the second PLE layer, so its hash
primes and seed differ from the first's), indexed attention; MoE with four experts, two
hyper-connection streams. Widths follow ``tests.tiny_checkpoints`` (H = 128, GDN key/value head
ratio 2 with dk != dv, GQA ratio 2) so every weight format fits: an expert's gate, up and down
are 128 rows each (NVFP4 stacks need rows % 128) over K = 128. The tokenizer is the tiny byte
BPE of ``tests.tiny_checkpoints``; its ``<|im_end|>`` is the EOS the n-gram hash pads with.

``build(directory)`` writes the text-only ``Qwen4ExpForCausalLM`` layout (``model.``) with
random ``mtp.*`` tensors; ``multimodal=True`` writes ``Qwen4ExpForConditionalGeneration``'s
(``model.language_model.``, a one-block ``model.visual.*`` tower drawn as the Qwen3.5 tower
tests draw theirs), with the vision specials in the tokenizer, ninfer's built-in ChatML (which
writes image parts) as the chat template and a ``preprocessor_config.json`` (16-pixel merged
blocks). The MTP tensors follow the layout ``ninfer_convert.adapters.qwen4_exp`` documents
(transformers defines no MTP block).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tests.runtime.test_vision_tower import randomize_vision
from tests.tiny_checkpoints import randomize, write_tokenizer

LAYER_TYPES = ["linear_attention", "indexed_attention", "linear_attention", "indexed_attention"]
TEXT: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=128,
    num_hidden_layers=4,
    layer_types=LAYER_TYPES,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=128,
    hc_count=2,
    hc_lowrank=16,
    ple_layer_ids=[1, 3],  # one-indexed: decoder layers 0 and 2
    ngram_size=3,
    heads_per_ngram=2,
    ngram_vocab_size_base=100,
    split_ngram_parts=3,  # saved as shards of 171, 171 and 170 rows (transformers' torch.chunk)
    indexer_n_heads=2,
    indexer_kv_heads=1,
    indexer_head_dim=64,
    indexer_budget=16,
    indexer_compress_ratio=4,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    max_position_embeddings=4096,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 1e7,
        "partial_rotary_factor": 0.25,
        "mrope_section": [4, 2, 2],
    },
)
VISION: dict[str, Any] = dict(
    depth=1,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    patch_size=8,
    temporal_patch_size=2,
    spatial_merge_size=2,
    out_hidden_size=128,
    num_position_embeddings=16,
)
#: the image processor of the multimodal checkpoint: patch 8, merge 2 (sides multiples of 16)
PROCESSOR: dict[str, Any] = {
    "patch_size": VISION["patch_size"],
    "temporal_patch_size": VISION["temporal_patch_size"],
    "merge_size": VISION["spatial_merge_size"],
    "size": {"shortest_edge": 256, "longest_edge": 16384},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
#: the vision specials the multimodal tokenizer adds (ids just below the vocabulary)
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
#: transformers' n-gram hash buffers: derived from the config, saved with the weights
DERIVED_BUFFERS = ("layer_multipliers", "ngram_heads_vocab_sizes", "ngram_heads_offsets")


def text_config(eos: int, **overrides: Any) -> Any:
    from transformers import Qwen4ExpTextConfig

    return Qwen4ExpTextConfig(**{**TEXT, "eos_token_id": eos, **overrides})


def build(
    directory: Path,
    *,
    multimodal: bool = False,
    mtp: bool = True,
    seed: int = 0,
    **overrides: Any,
) -> Path:
    """Save a tiny checkpoint; ``overrides`` change text config members."""
    from tokenizers import Tokenizer
    from transformers import (
        Qwen4ExpConfig,
        Qwen4ExpForCausalLM,
        Qwen4ExpForConditionalGeneration,
    )

    directory.mkdir(parents=True, exist_ok=True)
    if multimodal:
        specials = write_vision_tokenizer(directory)
    else:
        write_tokenizer(directory, TEXT["vocab_size"])
    eos = Tokenizer.from_file(str(directory / "tokenizer.json")).token_to_id("<|im_end|>")
    torch.manual_seed(seed)
    text = text_config(eos, **overrides)
    if multimodal:
        config = Qwen4ExpConfig(
            text_config=text.to_dict(),
            vision_config=VISION,
            image_token_id=specials["<|image_pad|>"],
            video_token_id=specials["<|video_pad|>"],
            vision_start_token_id=specials["<|vision_start|>"],
            vision_end_token_id=specials["<|vision_end|>"],
        )
        model: torch.nn.Module = Qwen4ExpForConditionalGeneration(config)
    else:
        model = Qwen4ExpForCausalLM(text)
    randomize(model)
    if multimodal:
        randomize_vision(model.model.visual)
    model.eval().save_pretrained(directory)
    if mtp:
        add_mtp(directory, "model.language_model." if multimodal else "model.")
    return directory


def write_vision_tokenizer(directory: Path) -> dict[str, int]:
    """The tiny tokenizer with the vision specials on top, the built-in ChatML as the chat
    template and the image processor config -> the vision specials' ids."""
    from tokenizers import Tokenizer

    from ninfer_runtime.frontend.chat_template import builtin_template_source

    write_tokenizer(directory, TEXT["vocab_size"] - len(VISION_TOKENS))
    path = directory / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    tok.add_special_tokens(list(VISION_TOKENS))
    tok.save(str(path))
    (directory / "chat_template.jinja").write_text(builtin_template_source())
    (directory / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    return {name: tok.token_to_id(name) for name in VISION_TOKENS}


def add_mtp(directory: Path, text_prefix: str) -> None:
    """Random ``mtp.*`` tensors: the stem, one attention decoder layer (a noisy copy of the
    first attention layer, indexer included) and the MTP's own final mixer."""
    path = directory / "model.safetensors"
    tensors = load_file(path)
    config = json.loads((directory / "config.json").read_text())
    text = config.get("text_config", config)
    hidden, streams = text["hidden_size"], text["hc_count"] * text["hidden_size"]
    attention = text["layer_types"].index("indexed_attention")
    copies = {
        f"{text_prefix}layers.{attention}.": "mtp.layers.0.",
        f"{text_prefix}hyper_connection_mixer.": "mtp.hyper_connection_mixer.",
    }
    for name, value in list(tensors.items()):
        for source, target in copies.items():
            if name.startswith(source):
                noisy = value + 0.05 * torch.randn_like(value)
                tensors[target + name[len(source) :]] = noisy
    tensors["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden) * (0.6 / (2 * hidden) ** 0.5)
    tensors["mtp.pre_fc_norm_embedding.weight"] = 0.3 * torch.randn(hidden)
    tensors["mtp.pre_fc_norm_hidden.weight"] = 0.3 * torch.randn(streams)
    dtype = tensors["lm_head.weight"].dtype
    tensors = {
        k: (v.to(dtype) if k.startswith("mtp.") else v).contiguous() for k, v in tensors.items()
    }
    save_file(tensors, path, metadata={"format": "pt"})


def state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """The saved weights (every shard), derived hash buffers left out."""
    out: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(load_file(path))
    return {k: v for k, v in out.items() if k.rsplit(".", 1)[-1] not in DERIVED_BUFFERS}
