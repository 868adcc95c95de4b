"""A tiny random Qwen3.5 VLM checkpoint, dense or MoE, for the image tests of the engine and
the server: a small byte-level BPE with the Qwen specials (vision ones included, no chat
template, so the engine uses its built-in one), random text and vision weights, and an image
processor config of 8×8-pixel merged tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.runtime.test_vision_tower import VISION, randomize_vision
from tests.tiny_checkpoints import COMMON, CORPUS, randomize, write_generation_config

SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
    "</tool_call>", "<tool_response>", "</tool_response>", "<|vision_start|>",
    "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
]  # fmt: skip
#: patch 4, merge 2: sides are multiples of 8 pixels, one merged token per 8×8 block
PROCESSOR = {
    "patch_size": 4,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "size": {"shortest_edge": 64, "longest_edge": 4096},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


def write_tokenizer(directory: Path) -> dict[str, int]:
    """A small byte-level BPE with the Qwen specials, vision ones included (ids below the
    vocabulary); no chat template, so the engine uses its built-in one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=COMMON["vocab_size"] - len(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens(SPECIALS)
    tok.save(str(directory / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
              "tokenizer_class": "PreTrainedTokenizerFast"}  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    write_generation_config(directory)
    return {name: tok.token_to_id(name) for name in SPECIALS}


def write_tiny_vlm(directory: Path, experts: dict[str, Any] | None = None) -> Path:
    """Saves the tokenizer, a ``Qwen3_5ForConditionalGeneration`` (or, given ``experts``' text
    config members, a ``Qwen3_5MoeForConditionalGeneration``) with every weight random (seed 0)
    and the image processor config in ``directory``; returns it."""
    import torch
    import transformers as t

    ids = write_tokenizer(directory)
    torch.manual_seed(0)
    if experts is None:
        text = t.Qwen3_5TextConfig(intermediate_size=256, **COMMON)
        kind, vision = t.Qwen3_5Config, t.Qwen3_5VisionConfig
        model_class = t.Qwen3_5ForConditionalGeneration
    else:
        text = t.Qwen3_5MoeTextConfig(**experts, **COMMON)
        kind, vision = t.Qwen3_5MoeConfig, t.Qwen3_5MoeVisionConfig
        model_class = t.Qwen3_5MoeForConditionalGeneration
    config = kind(
        text_config=text.to_dict(),
        vision_config=vision(**VISION),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    model = model_class(config)
    randomize(model)
    randomize_vision(model.model.visual)
    model.eval().save_pretrained(directory)
    (directory / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    return directory
