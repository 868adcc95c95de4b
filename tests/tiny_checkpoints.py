"""Tiny random Qwen3.5 checkpoints built with transformers, for converter and runtime tests.

Sizes are chosen so that every weight format fits (NVFP4 needs rows % 128 after packing),
GDN has key/value head ratio 2 with dk != dv, attention has GQA ratio 2, and the weights are
scaled so logits are far from flat.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ninfer_runtime.bench.geometries import TINY_SHAPES
from ninfer_runtime.bench.synthetic import CHATML, SPECIAL_TOKENS

COMMON = dict(
    **TINY_SHAPES,
    num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    max_position_embeddings=4096,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 1e7,
        "partial_rotary_factor": 0.25,
        "mrope_section": [4, 2, 2],
        "mrope_interleaved": True,
    },
)


def randomize(model: torch.nn.Module, scale: float = 0.6) -> None:
    """Default init gives near-zero logits; these draws make mapping mistakes visible."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.01, 16).log())
            elif name.endswith("dt_bias"):
                p.normal_()
            elif "linear_attn.norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif "norm" in name:
                p.normal_(0, 0.3)
            elif "conv1d" in name:
                p.normal_(0, 0.4)
            elif "embed" in name:
                p.normal_()
            else:
                p.normal_(0, scale / p.shape[-1] ** 0.5)


def build(directory: Path, *, moe: bool = False, mtp: bool = True, seed: int = 0) -> Path:
    """Save a tiny checkpoint (text layout, per-expert MoE) with random MTP weights."""
    from transformers import (
        Qwen3_5ForCausalLM,
        Qwen3_5MoeForCausalLM,
        Qwen3_5MoeTextConfig,
        Qwen3_5TextConfig,
    )

    torch.manual_seed(seed)
    if moe:
        config = Qwen3_5MoeTextConfig(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=128,
            shared_expert_intermediate_size=128,
            **COMMON,
        )
        model = Qwen3_5MoeForCausalLM(config)
    else:
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(intermediate_size=256, **COMMON))
    randomize(model)
    model.eval().save_pretrained(directory)
    if mtp:
        add_mtp(directory, model)
    write_tokenizer(directory, COMMON["vocab_size"])
    return directory


def add_mtp(directory: Path, model: torch.nn.Module) -> None:
    """Append random ``mtp.*`` tensors: fc, the three norms and one full-attention layer."""
    path = directory / "model.safetensors"
    tensors = load_file(path)
    hidden = model.config.hidden_size
    full = model.config.layer_types.index("full_attention")
    prefix = f"model.layers.{full}."
    for name, value in list(tensors.items()):
        if name.startswith(prefix):
            suffix = name[len(prefix) :]
            tensors[f"mtp.layers.0.{suffix}"] = value + 0.05 * torch.randn_like(value)
    tensors["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden) * (0.6 / (2 * hidden) ** 0.5)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"mtp.{norm}.weight"] = 0.3 * torch.randn(hidden)
    dtype = tensors["lm_head.weight"].dtype
    tensors = {
        k: (v.to(dtype) if k.startswith("mtp.") else v).contiguous() for k, v in tensors.items()
    }
    save_file(tensors, path, metadata={"format": "pt"})


CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you today? I am fine, thank you.",
    "def add(a, b):\n    return a + b\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
    "The weather is sunny and warm; tomorrow it may rain.",
] * 20


def write_tokenizer(
    directory: Path, vocab_size: int = 512, corpus: list[str] | None = None
) -> None:
    """A small byte-level BPE with the Qwen special tokens, ids below ``vocab_size``."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus or CORPUS, trainer)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "model_max_length": 4096,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (directory / "chat_template.jinja").write_text(CHATML)
    write_generation_config(directory)


def write_generation_config(directory: Path) -> None:
    """EOS ids and sampling defaults (``save_pretrained`` writes one without them)."""
    import json

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    generation = {
        "eos_token_id": eos,
        "pad_token_id": eos[1],
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
    }
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2))
