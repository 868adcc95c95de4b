"""The base directory a llama.cpp ``qwen35`` / ``qwen35moe`` GGUF carries in its metadata.

A GGUF import reads its weights from the .gguf file and the model's config and frontend
files from a base directory. A GGUF written by llama.cpp holds everything that directory
would: the architecture (``qwen35.*`` or ``qwen35moe.*`` keys, gguf-py's ``Keys`` names),
the BPE vocabulary (``tokenizer.ggml.*``), the chat template and the special token ids.
``write_base`` writes them out as ``config.json``, ``tokenizer.json``,
``tokenizer_config.json``, ``chat_template.jinja`` and ``generation_config.json``, so
``--source model.gguf`` alone converts.

The tokenizer is rebuilt only where the file's pre-tokenizer (``tokenizer.ggml.pre``) is one
whose splitting rule is known here; any other is refused with the way round it (a base
directory with the tokenizer files), never guessed. Tokens of type control become special
added tokens, user-defined ones added tokens, unused ones (llama.cpp's vocabulary padding)
are left out, as the checkpoint's own tokenizer has them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gguf.constants import Keys, TokenType

from ninfer_format.binders.qwen3_5_geometry import (
    DENSE,
    MOE,
    GeometryError,
    Qwen35Geometry,
    layer_types_for_interval,
)

from ..errors import SourceError
from .gguf_file import GgufSource

#: llama.cpp architecture -> the text config's model_type
MODEL_TYPES = {"qwen35": DENSE, "qwen35moe": MOE}
#: Qwen2's splitting rule (contractions, letters, single digits, punctuation runs, newlines)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: Qwen3.5's rule: Qwen2's, with combining marks (\p{M}) counted as letters, so a vowel sign
#: stays in its word instead of splitting off as punctuation
QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False}


def _nfc_then_split(pattern: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Qwen tokenizers' shape: NFC, the regex's pieces kept whole, then byte-level."""
    split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
             "invert": False}  # fmt: skip
    byte_level = {**BYTE_LEVEL, "use_regex": False}
    return {"type": "NFC"}, {"type": "Sequence", "pretokenizers": [split, byte_level]}


#: tokenizer.ggml.pre -> (normalizer, pre-tokenizer) of the tokenizer.json; the names and
#: rules are llama.cpp's (``qwen35`` is what its converter writes for Qwen3.5 / 3.6)
PRE_TOKENIZERS: dict[str, tuple[dict[str, Any] | None, dict[str, Any]]] = {
    "gpt-2": (None, {**BYTE_LEVEL, "use_regex": True}),
    "qwen2": _nfc_then_split(QWEN2_SPLIT),
    "qwen35": _nfc_then_split(QWEN35_SPLIT),
}
#: tokens that end a generation whichever ids the file names: llama.cpp's converter writes
#: no end-of-turn id for Qwen, and a Qwen checkpoint's generation_config lists both
END_TEXTS = ("<|im_end|>", "<|endoftext|>")
#: what a user does when the metadata cannot stand in for the base directory
WAY_ROUND = (
    "give the checkpoint's config and tokenizer files as a base directory instead "
    "(--source base=DIR --source gguf=FILE.gguf)"
)


def write_base(source: GgufSource, directory: Path) -> Path:
    """The base files of ``source`` in ``directory`` (created); the directory."""
    config = text_config(source)
    tokenizer = tokenizer_json(source)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(source, config), indent=2)
    )
    (directory / "generation_config.json").write_text(
        json.dumps(generation_config(source), indent=2)
    )
    template = source.get(Keys.Tokenizer.CHAT_TEMPLATE)
    if isinstance(template, str):
        (directory / "chat_template.jinja").write_text(template)
    return directory


def _key(source: GgufSource, template: str, *, default: Any = None) -> Any:
    key = template.format(arch=source.architecture)
    value = source.get(key, default)
    if value is None:
        raise SourceError(f"{source.path}: metadata key {key!r} is missing; it defines the model")
    return value


def text_config(source: GgufSource) -> dict[str, Any]:
    """The Qwen3.5 text config (``config.json``) the ``qwen35.*`` (``qwen35moe.*``) keys
    describe."""
    model_type = MODEL_TYPES.get(source.architecture or "")
    if model_type is None:
        raise SourceError(
            f"{source.path}: general.architecture is {source.architecture!r}; a config can be "
            f"read from {', '.join(MODEL_TYPES)} files ({WAY_ROUND})"
        )
    nextn = int(_key(source, Keys.LLM.NEXTN_PREDICT_LAYERS, default=0))
    layers = int(_key(source, Keys.LLM.BLOCK_COUNT)) - nextn
    interval = int(_key(source, Keys.LLM.FULL_ATTENTION_INTERVAL))
    head_dim = int(_key(source, Keys.Attention.KEY_LENGTH))
    value_heads = int(_key(source, Keys.SSM.TIME_STEP_RANK))
    # the multimodal rotary sections (llama.cpp pads them to four with zeros), interleaved
    # as Qwen3.5 lays them out
    sections = [int(s) for s in _key(source, Keys.Rope.DIMENSION_SECTIONS) if int(s)]
    if model_type == MOE:
        widths = {
            "num_experts": int(_key(source, Keys.LLM.EXPERT_COUNT)),
            "num_experts_per_tok": int(_key(source, Keys.LLM.EXPERT_USED_COUNT)),
            "moe_intermediate_size": int(_key(source, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH)),
            "shared_expert_intermediate_size": int(
                _key(source, Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH)
            ),
        }
    else:
        widths = {"intermediate_size": int(_key(source, Keys.LLM.FEED_FORWARD_LENGTH))}
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": float(_key(source, Keys.Rope.FREQ_BASE)),
        "partial_rotary_factor": int(_key(source, Keys.Rope.DIMENSION_COUNT)) / head_dim,
        "mrope_section": sections,
        "mrope_interleaved": True,
    }
    vocab = source.get(Keys.Tokenizer.LIST)
    try:
        layer_types = layer_types_for_interval(layers, interval)
    except ValueError as exc:
        raise SourceError(f"{source.path}: {exc} ({WAY_ROUND})") from None
    config = {
        "model_type": model_type,
        "hidden_size": int(_key(source, Keys.LLM.EMBEDDING_LENGTH)),
        **widths,
        "num_hidden_layers": layers,
        "layer_types": layer_types,
        "num_attention_heads": int(_key(source, Keys.Attention.HEAD_COUNT)),
        "num_key_value_heads": int(_key(source, Keys.Attention.HEAD_COUNT_KV)),
        "head_dim": head_dim,
        "linear_conv_kernel_dim": int(_key(source, Keys.SSM.CONV_KERNEL)),
        "linear_key_head_dim": int(_key(source, Keys.SSM.STATE_SIZE)),
        "linear_num_key_heads": int(_key(source, Keys.SSM.GROUP_COUNT)),
        "linear_num_value_heads": value_heads,
        "linear_value_head_dim": int(_key(source, Keys.SSM.INNER_SIZE)) // value_heads,
        "max_position_embeddings": int(_key(source, Keys.LLM.CONTEXT_LENGTH)),
        "rms_norm_eps": float(_key(source, Keys.Attention.LAYERNORM_RMS_EPS)),
        "rope_parameters": rope,
        "tie_word_embeddings": "output.weight" not in source,
        "vocab_size": source.shape("token_embd.weight")[0]
        if "token_embd.weight" in source
        else len(vocab or ()),
        "hidden_act": "silu",
        "attention_bias": False,
    }
    # the keys above are llama.cpp's names for the config's members; whether they define a
    # model at all is the one Qwen3.5 geometry's to say
    try:
        Qwen35Geometry.from_config(config)
    except GeometryError as exc:
        raise SourceError(
            f"{source.path}: the metadata does not define a Qwen3.5 model: "
            f"{'; '.join(exc.problems)} ({WAY_ROUND})"
        ) from None
    return config


def tokenizer_json(source: GgufSource) -> dict[str, Any]:
    """A ``tokenizer.json`` (byte-level BPE) from the ``tokenizer.ggml.*`` keys."""
    model = source.get(Keys.Tokenizer.MODEL)
    pre = source.get(Keys.Tokenizer.PRE)
    if model != "gpt2":
        raise SourceError(
            f"{source.path}: tokenizer.ggml.model is {model!r}; a tokenizer can be rebuilt "
            f"from 'gpt2' (byte-level BPE) only: {WAY_ROUND}"
        )
    if pre is None:
        raise SourceError(
            f"{source.path}: tokenizer.ggml.pre is missing, so its splitting rule is unknown "
            f"(expected one of {', '.join(PRE_TOKENIZERS)}): {WAY_ROUND}"
        )
    if pre not in PRE_TOKENIZERS:
        raise SourceError(
            f"{source.path}: tokenizer.ggml.pre {pre!r} is not one whose splitting rule is "
            f"known here ({', '.join(PRE_TOKENIZERS)}): {WAY_ROUND}"
        )
    tokens = list(source.get(Keys.Tokenizer.LIST) or ())
    types = list(source.get(Keys.Tokenizer.TOKEN_TYPE) or [TokenType.NORMAL] * len(tokens))
    merges = list(source.get(Keys.Tokenizer.MERGES) or ())
    if not tokens or len(types) != len(tokens):
        raise SourceError(
            f"{source.path}: tokenizer.ggml.tokens and .token_type must be non-empty and of "
            f"one length, got {len(tokens)} and {len(types)}"
        )
    vocab, added = {}, []
    for i, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind in (TokenType.CONTROL, TokenType.USER_DEFINED):
            added.append(
                {"id": i, "content": token, "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": False, "special": kind == TokenType.CONTROL}
            )  # fmt: skip
        elif kind != TokenType.UNUSED:
            vocab[token] = i
    normalizer, pre_tokenizer = PRE_TOKENIZERS[pre]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": {**BYTE_LEVEL, "add_prefix_space": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [merge.split(" ", 1) for merge in merges],
        },
    }


def _token(source: GgufSource, key: str) -> str | None:
    index = source.get(key)
    tokens = source.get(Keys.Tokenizer.LIST) or ()
    return tokens[int(index)] if index is not None and 0 <= int(index) < len(tokens) else None


def tokenizer_config(source: GgufSource, config: dict[str, Any]) -> dict[str, Any]:
    add_bos = bool(source.get(Keys.Tokenizer.ADD_BOS, False))
    return {
        "eos_token": _token(source, Keys.Tokenizer.EOS_ID),
        "pad_token": _token(source, Keys.Tokenizer.PAD_ID),
        "bos_token": _token(source, Keys.Tokenizer.BOS_ID) if add_bos else None,
        "model_max_length": config["max_position_embeddings"],
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def generation_config(source: GgufSource) -> dict[str, Any]:
    """End-of-sequence ids (the eos, the end-of-turn id, then the end tokens named by their
    text) and the pad."""
    eos = [source.get(Keys.Tokenizer.EOS_ID), source.get(Keys.Tokenizer.EOT_ID)]
    tokens = list(source.get(Keys.Tokenizer.LIST) or ())
    eos += [tokens.index(text) for text in END_TEXTS if text in tokens]
    ids = list(dict.fromkeys(int(i) for i in eos if i is not None))
    out: dict[str, Any] = {"eos_token_id": ids}
    pad = source.get(Keys.Tokenizer.PAD_ID)
    if pad is not None:
        out["pad_token_id"] = int(pad)
    return out
