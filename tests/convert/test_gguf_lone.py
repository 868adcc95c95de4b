"""``--source model.gguf`` alone: the config, tokenizer, chat template and special ids come
from the GGUF's own metadata (``sources/gguf_base.py``), written here the way llama.cpp's
converter writes them for a ``qwen35`` model (gguf-py's keys, ``tokenizer.ggml.*`` from the
tiny checkpoint's byte-level BPE, its padding ids as unused tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import TokenType
from tokenizers import Tokenizer

from ninfer_convert.errors import SourceError
from ninfer_convert.pipeline import convert
from ninfer_convert.sources import GgufSource
from ninfer_convert.sources.gguf_base import generation_config, text_config, tokenizer_json
from ninfer_format import Artifact

from .test_gguf_import import build_gguf, config_only

ARCH = "qwen35"
TEXTS = [
    "Hello, world! It's 2026.",
    "  spaces\tand\nnewlines\n\n",
    "<|im_start|>user\nWhat is 7 x 6?<|im_end|>\n",
    "naïve café, 東京, emoji 🙂",
]


def metadata(hf_dir: Path, pre: str = "gpt-2") -> dict[str, tuple[str, object]]:
    """The keys llama.cpp writes beside the geometry: context, rope, norm epsilon, MTP
    layers, and the tokenizer (vocabulary padded to the model's rows with unused tokens)."""
    config = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    rope = config["rope_parameters"]
    tokens = [""] * config["vocab_size"]
    types = [TokenType.UNUSED] * config["vocab_size"]
    for text, i in tok["model"]["vocab"].items():
        tokens[i], types[i] = text, TokenType.NORMAL
    for added in tok["added_tokens"]:
        i = added["id"]
        tokens[i] = added["content"]
        types[i] = TokenType.CONTROL if added["special"] else TokenType.USER_DEFINED
    for i, text in enumerate(tokens):
        tokens[i] = text or f"[PAD{i}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    generation = json.loads((hf_dir / "generation_config.json").read_text())
    head_dim = config["head_dim"]
    return {
        f"{ARCH}.context_length": ("uint32", config["max_position_embeddings"]),
        f"{ARCH}.rope.freq_base": ("float32", rope["rope_theta"]),
        f"{ARCH}.rope.dimension_count": ("uint32", int(head_dim * rope["partial_rotary_factor"])),
        f"{ARCH}.rope.dimension_sections": ("ints", [*rope["mrope_section"], 0]),
        f"{ARCH}.attention.layer_norm_rms_epsilon": ("float32", config["rms_norm_eps"]),
        f"{ARCH}.nextn_predict_layers": ("uint32", 1),
        "tokenizer.ggml.model": ("string", "gpt2"),
        "tokenizer.ggml.pre": ("string", pre),
        "tokenizer.ggml.tokens": ("strings", tokens),
        "tokenizer.ggml.token_type": ("ints", [int(t) for t in types]),
        "tokenizer.ggml.merges": ("strings", merges),
        # end of text as the eos, end of turn as the eot (the checkpoint lists both)
        "tokenizer.ggml.eos_token_id": ("uint32", generation["eos_token_id"][-1]),
        "tokenizer.ggml.eot_token_id": ("uint32", generation["eos_token_id"][0]),
        "tokenizer.ggml.padding_token_id": ("uint32", generation["pad_token_id"]),
        "tokenizer.chat_template": ("string", (hf_dir / "chat_template.jinja").read_text()),
    }


def write_lone(hf_dir: Path, path: Path, **changes: tuple[str, object] | None) -> Path:
    """A GGUF of the checkpoint with every key a lone conversion reads (``changes`` replace
    or, given None, drop keys; "." written "__")."""
    meta = metadata(hf_dir)
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            meta.pop(key)
        else:
            meta[key] = value
    build_gguf(hf_dir, path, faithful=True, extra=meta)
    return path


@pytest.fixture(scope="module")
def lone(tiny_dense, tmp_path_factory) -> Path:
    return write_lone(tiny_dense, tmp_path_factory.mktemp("lone") / "tiny.gguf")


def test_config_from_the_metadata_is_the_checkpoints(tiny_dense, lone) -> None:
    config = json.loads((tiny_dense / "config.json").read_text())
    got = text_config(GgufSource(lone))
    for key in (
        "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "layer_types",
        "num_attention_heads", "num_key_value_heads", "head_dim", "linear_conv_kernel_dim",
        "linear_key_head_dim", "linear_num_key_heads", "linear_num_value_heads",
        "linear_value_head_dim", "max_position_embeddings", "vocab_size", "tie_word_embeddings",
    ):  # fmt: skip
        assert got[key] == config[key], key
    assert got["rms_norm_eps"] == pytest.approx(config["rms_norm_eps"])
    rope = config["rope_parameters"]
    assert got["rope_parameters"]["rope_theta"] == pytest.approx(rope["rope_theta"])
    assert got["rope_parameters"]["partial_rotary_factor"] == rope["partial_rotary_factor"]
    assert got["rope_parameters"]["mrope_section"] == rope["mrope_section"]
    generation = json.loads((tiny_dense / "generation_config.json").read_text())
    ours = generation_config(GgufSource(lone))
    assert set(ours["eos_token_id"]) == set(generation["eos_token_id"])
    assert ours["pad_token_id"] == generation["pad_token_id"]


def test_tokenizer_from_the_metadata_encodes_as_the_checkpoints(tiny_dense, lone) -> None:
    want = Tokenizer.from_file(str(tiny_dense / "tokenizer.json"))
    got = Tokenizer.from_str(json.dumps(tokenizer_json(GgufSource(lone))))
    assert got.get_vocab_size() == want.get_vocab_size()
    for text in TEXTS:
        ids = want.encode(text).ids
        assert got.encode(text).ids == ids, text
        assert got.decode(ids, skip_special_tokens=False) == want.decode(
            ids, skip_special_tokens=False
        )


def test_a_lone_gguf_converts_and_answers_as_with_its_base_directory(
    tiny_dense, lone, tmp_path
) -> None:
    """The same file converted alone and with the checkpoint's base directory: the same
    weights, and the engine's greedy answer token for token."""
    from ninfer_runtime.engine import Engine, GenerationRequest, TokenEvent
    from ninfer_runtime.frontend import SamplingParams

    alone, based = tmp_path / "alone.ninfer", tmp_path / "based.ninfer"
    convert("qwen3_8_27b_gguf", {"base": str(lone)}, alone)
    base = config_only(tiny_dense, tmp_path / "base")
    convert("qwen3_8_27b_gguf", {"base": str(base), "gguf": str(lone)}, based)
    with Artifact.open(alone) as a, Artifact.open(based) as b:
        assert a.binder_report.ok, a.binder_report.errors
        assert set(a.components) == {"text", "mtp"}
        assert set(a.components["text"].resources) >= {"tokenizer.json", "chat_template.jinja"}
        for name in ("text/layers/0/gdn/output", "text/token_embedding"):
            np.testing.assert_array_equal(a.parameter(name), b.parameter(name))

    def answer(path: Path) -> list[int]:
        engine = Engine(path, max_context=256)
        request = GenerationRequest(
            messages=[{"role": "user", "content": "What is 7 x 6?"}],
            sampling=SamplingParams(temperature=0.0, max_tokens=12),
        )
        return [e.token_id for e in engine.generate(request) if isinstance(e, TokenEvent)]

    assert answer(alone) == answer(based)


def test_unknown_pre_tokenizer_and_missing_keys_are_refused(tiny_dense, tmp_path) -> None:
    odd = write_lone(tiny_dense, tmp_path / "odd.gguf", tokenizer__ggml__pre=("string", "odd"))
    with pytest.raises(SourceError, match=r"tokenizer.ggml.pre 'odd' is not one .* base=DIR"):
        convert("qwen3_8_27b_gguf", {"base": str(odd)}, tmp_path / "odd.ninfer")
    bare = write_lone(tiny_dense, tmp_path / "bare.gguf", qwen35__rope__freq_base=None)
    with pytest.raises(SourceError, match=r"metadata key 'qwen35.rope.freq_base' is missing"):
        convert("qwen3_8_27b_gguf", {"base": str(bare)}, tmp_path / "bare.ninfer")
    assert not (tmp_path / "odd.ninfer").exists() and not (tmp_path / "bare.ninfer").exists()


def test_qwen2_pre_tokenizer_splits_as_its_rule() -> None:
    """The ``qwen2`` rule by hand: a contraction, a lone space before digits, digits one by
    one, punctuation with the newlines after it (bytes shown byte-level: Ġ space, Ċ
    newline)."""
    from ninfer_convert.sources.gguf_base import PRE_TOKENIZERS

    _, pre = PRE_TOKENIZERS["qwen2"]
    doc = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": pre, "post_processor": None, "decoder": None,
        "model": {"type": "BPE", "vocab": {}, "merges": []},
    }  # fmt: skip
    split = Tokenizer.from_str(json.dumps(doc)).pre_tokenizer.pre_tokenize_str("I'm 42!\n\nok")
    assert [piece for piece, _ in split] == ["I", "'m", "Ġ", "4", "2", "!ĊĊ", "ok"]
