"""The text resources of a synthetic artifact: a minimal byte-level BPE tokenizer with the Qwen
special tokens, its config, a ChatML template and a generation config. Nothing here needs the
converter, so tests and benchmarks that build tokenizer files can share it."""

from __future__ import annotations

import json


def _byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character map (what a byte-level BPE vocabulary holds)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def text_resources(
    extra_specials: tuple[str, ...] = (), template: str = CHATML
) -> dict[str, bytes]:
    """A minimal byte-level BPE tokenizer (256 byte tokens, no merges, the Qwen specials, then
    ``extra_specials``) and the other three text resources (``template``: the chat template);
    ids stay below every geometry's vocabulary."""
    vocab = {c: i for i, c in enumerate(_byte_alphabet())}
    added = [
        {"id": 256 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, t in enumerate((*SPECIAL_TOKENS, *extra_specials))
    ]  # fmt: skip
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}  # fmt: skip
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False, "vocab": vocab, "merges": [],
        },
    }  # fmt: skip
    config = {
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "model_max_length": 262144,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    generation = {"eos_token_id": [256 + SPECIAL_TOKENS.index("<|im_end|>"), 256],
                  "do_sample": False}  # fmt: skip
    return {
        "tokenizer.json": json.dumps(tokenizer).encode(),
        "tokenizer_config.json": json.dumps(config, indent=2).encode(),
        "chat_template.jinja": template.encode(),
        "generation_config.json": json.dumps(generation, indent=2).encode(),
    }
