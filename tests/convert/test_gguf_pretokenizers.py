"""A Qwen3.5 GGUF as llama.cpp's converter writes it (``tokenizer.ggml.pre = "qwen35"``)
converts alone and tokenizes as the checkpoint does.

The checkpoint is the tiny one with a tokenizer of Qwen3.5's kind: a byte-level BPE trained
here behind the normalizer and split transformers' ``Qwen3_5Tokenizer`` defines (NFC, then
Qwen3.5's regex, where combining marks count as letters), with added tokens of each kind the
real one has (special, not special, and not special but spelled ``<|...|>``) and ids left
free at the end. Its GGUF gets the tokenizer keys the way llama.cpp's converter writes them
for a ``gpt2`` vocabulary: every id below the model's vocab_size a token, an unused
``[PAD{i}]`` where the tokenizer has none, added tokens typed control when special or spelled
``<|...|>``, user-defined otherwise; then gguf-py's ``SpecialVocab`` (merges, special ids,
chat template), the same library call the converter makes.
"""

from __future__ import annotations

import json
import shutil
import unicodedata
from pathlib import Path

import gguf
import pytest
from click.testing import CliRunner
from gguf.constants import TokenType
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from ninfer_convert.cli import main as convert_cli
from ninfer_convert.pipeline import convert
from ninfer_convert.sources import GgufSource
from ninfer_convert.sources.gguf_base import PRE_TOKENIZERS, tokenizer_json
from tests.tiny_checkpoints import write_generation_config

from .test_gguf_import import build_gguf, config_only
from .test_gguf_lone import metadata

CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>"]
#: added but not special; llama.cpp still types ``<|fim_pad|>`` control by its spelling
NOT_SPECIAL = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<|fim_pad|>"]
FREE_IDS = 20  # ids past the tokenizer's, as a checkpoint pads its embedding rows
TEXTS = [
    "Hello, world! It's 2026.",
    "I'm sure they'll say we'd've done it; you're right, THEY'RE WRONG.",
    "12345678 + 0.5 = 12345678.5",
    "Phone: +1 (555) 010-9999, ext. 42",
    "naïve café, jalapeño, Ångström, Straße",
    "cafe\u0301 and nai\u0308ve, decomposed",
    "नमस्ते दुनिया, हिन्दी में लिखा",
    "สวัสดีครับ ภาษาไทย",
    "東京都は日本の首都です。",
    "你好，世界！今天是2026年8月13日",
    "한국어 문장입니다",
    "emoji 🙂🚀 and 👨‍👩‍👧 family, ✅ done",
    "  leading spaces, then\ttabs\t\tand   runs     of spaces",
    "line one\nline two\r\nline three\n\n\nend",
    "def add(a, b):\n    return a + b  # sum\n",
    'if (x >= 10 && y != "ok") { return [1, 2, 3]; }',
    "<|im_start|>user\nWhat is 7 x 6?<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nLet me see.\n</think>\n\nThe answer is 42.<|endoftext|>",
    '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
    "text<|fim_pad|>between<|vision_start|>tokens",
    "Ünïcödé ½ ² ∑ ∞ → ≠ — “quotes” ‘single’ …",
    "Привет, мир! Ελληνικά. العربية.",
    "'''\"\"\"```......!!!!!!??????",
    "",
    " ",
]
#: the texts the trained merges cover (the test texts among them, so whole words merge)
CORPUS = [*TEXTS, "The quick brown fox jumps over the lazy dog.", "नमस्ते नमस्ते हिन्दी"] * 8


def write_qwen35_tokenizer(directory: Path, vocab_size: int) -> None:
    """``tokenizer.json`` of Qwen3.5's kind in ``directory``, its ids below ``vocab_size``."""
    from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer

    published = Qwen3_5Tokenizer().backend_tokenizer
    tok = Tokenizer(models.BPE())
    tok.normalizer = published.normalizer
    tok.pre_tokenizer = published.pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    added = len(CONTROL) + len(NOT_SPECIAL)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - added - FREE_IDS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NOT_SPECIAL])
    tok.save(str(directory / "tokenizer.json"))


@pytest.fixture(scope="module")
def checkpoint(tiny_dense, tmp_path_factory) -> Path:
    """The tiny checkpoint's weights with a Qwen3.5-style tokenizer; its config names the
    bos and eos ids, as Qwen's do."""
    directory = tmp_path_factory.mktemp("qwen35_checkpoint")
    for name in ("model.safetensors", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_dense / name, directory / name)
    config = json.loads((tiny_dense / "config.json").read_text())
    write_qwen35_tokenizer(directory, config["vocab_size"])
    write_generation_config(directory)
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    config["bos_token_id"] = tok.token_to_id("<|endoftext|>")
    config["eos_token_id"] = tok.token_to_id("<|im_end|>")
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


class WrittenKeys:
    """Stands in for gguf-py's ``GGUFWriter`` where the converter writes the vocabulary: the
    writer's own ``add_token_list``, ``add_bos_token_id``, ... run as they are, and the keys
    they set are kept as ``build_gguf``'s (kind, value)."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[str, object]] = {}

    def add_string(self, key: str, value: str) -> None:
        self.keys[key] = ("string", value)

    def add_uint32(self, key: str, value: int) -> None:
        self.keys[key] = ("uint32", value)

    def add_bool(self, key: str, value: bool) -> None:
        self.keys[key] = ("bool", value)

    def add_array(self, key: str, values: list) -> None:
        kind = "strings" if values and isinstance(values[0], str) else "ints"
        self.keys[key] = (kind, list(values))

    def __getattr__(self, name: str):
        return getattr(gguf.GGUFWriter, name).__get__(self)


def vocabulary(hf_dir: Path, vocab_size: int) -> tuple[list[str], list[int]]:
    """Every id below ``vocab_size`` as a token and its type, as llama.cpp assigns them."""
    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    by_id = {i: text for text, i in tok.get_vocab(with_added_tokens=True).items()}
    added = tok.get_added_tokens_decoder()
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
            continue
        text = by_id[i]
        tokens.append(text)
        if i not in added:
            types.append(TokenType.NORMAL)
        elif added[i].special or (text.startswith("<|") and text.endswith("|>")):
            types.append(TokenType.CONTROL)
        else:
            types.append(TokenType.USER_DEFINED)
    return tokens, types


def tokenizer_keys(hf_dir: Path, pre: str | None) -> dict[str, tuple[str, object]]:
    """The ``tokenizer.*`` keys of a ``gpt2`` vocabulary, written in the converter's order."""
    config = json.loads((hf_dir / "config.json").read_text())
    tokens, types = vocabulary(hf_dir, config["vocab_size"])
    writer = WrittenKeys()
    writer.add_tokenizer_model("gpt2")
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(hf_dir, load_merges=True).add_to_gguf(writer, quiet=True)
    return writer.keys


def write_gguf(hf_dir: Path, path: Path, pre: str | None = "qwen35") -> Path:
    """The checkpoint as a GGUF: the geometry keys of the lone-GGUF tests, the vocabulary
    keys as llama.cpp writes them."""
    geometry = {k: v for k, v in metadata(hf_dir).items() if not k.startswith("tokenizer.")}
    build_gguf(hf_dir, path, faithful=True, extra={**geometry, **tokenizer_keys(hf_dir, pre)})
    return path


@pytest.fixture(scope="module")
def lone(checkpoint, tmp_path_factory) -> Path:
    return write_gguf(checkpoint, tmp_path_factory.mktemp("qwen35_gguf") / "qwen35.gguf")


def test_qwen35_metadata_encodes_as_the_checkpoints_tokenizer(checkpoint, lone) -> None:
    """The same ids as the checkpoint's tokenizer on every text, and the same text back;
    Qwen2's rule on the same vocabulary parts from it exactly where combining marks are."""
    source = GgufSource(lone)
    assert source.get("tokenizer.ggml.pre") == "qwen35"
    tokens = source.get("tokenizer.ggml.tokens")
    types = dict(zip(tokens, source.get("tokenizer.ggml.token_type"), strict=True))
    assert {types[t] for t in CONTROL} == {TokenType.CONTROL}
    assert types["<think>"] == TokenType.USER_DEFINED and types["a"] == TokenType.NORMAL
    assert types["<|fim_pad|>"] == TokenType.CONTROL
    assert types[f"[PAD{len(tokens) - 1}]"] == TokenType.UNUSED
    assert tokens[source.get("tokenizer.ggml.bos_token_id")] == "<|endoftext|>"
    assert tokens[source.get("tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    want = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    rebuilt = tokenizer_json(source)
    got = Tokenizer.from_str(json.dumps(rebuilt))
    assert got.get_vocab_size() == want.get_vocab_size()
    for text in TEXTS:
        ids = want.encode(text).ids
        assert got.encode(text).ids == ids, text
        assert got.decode(ids, skip_special_tokens=False) == want.decode(
            ids, skip_special_tokens=False
        )
    rebuilt["normalizer"], rebuilt["pre_tokenizer"] = PRE_TOKENIZERS["qwen2"]
    qwen2 = Tokenizer.from_str(json.dumps(rebuilt))
    parted = [t for t in TEXTS if qwen2.encode(t).ids != want.encode(t).ids]
    assert parted, "no text tells Qwen3.5's rule from Qwen2's"
    assert all(any(unicodedata.category(c).startswith("M") for c in t) for t in parted), parted


def test_a_lone_qwen35_gguf_converts_and_answers_as_with_its_checkpoint(
    checkpoint, lone, tmp_path
) -> None:
    """Converted alone and with the checkpoint's base directory: the engines encode every
    text as the checkpoint's tokenizer does and answer token for token alike."""
    from ninfer_runtime.engine import Engine, GenerationRequest, TokenEvent
    from ninfer_runtime.frontend import SamplingParams

    alone, based = tmp_path / "alone.ninfer", tmp_path / "based.ninfer"
    convert("qwen3_8_27b_gguf", {"base": str(lone)}, alone)
    base = config_only(checkpoint, tmp_path / "base")
    convert("qwen3_8_27b_gguf", {"base": str(base), "gguf": str(lone)}, based)
    want = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    engines = [Engine(path, max_context=256) for path in (alone, based)]
    for text in TEXTS:
        ids = want.encode(text).ids
        assert [e.tokenizer.encode(text) for e in engines] == [ids, ids], text

    def answer(engine: Engine, question: str) -> list[int]:
        request = GenerationRequest(
            messages=[{"role": "user", "content": question}],
            sampling=SamplingParams(temperature=0.0, max_tokens=12),
        )
        return [e.token_id for e in engine.generate(request) if isinstance(e, TokenEvent)]

    for question in ("What is 7 x 6?", "नमस्ते दुनिया, 東京 🙂 12345678"):
        first, second = (answer(e, question) for e in engines)
        assert first and first == second, question


@pytest.mark.parametrize(
    ("pre", "said"),
    [("not-a-rule", "tokenizer.ggml.pre 'not-a-rule' is not one"), (None, "pre is missing")],
)
def test_an_unknown_pre_tokenizer_is_refused_in_one_line(checkpoint, tmp_path, pre, said) -> None:
    odd = write_gguf(checkpoint, tmp_path / "odd.gguf", pre=pre)
    out = tmp_path / "odd.ninfer"
    args = ["--recipe", "qwen3_8_27b_gguf", "--source", str(odd), "-o", str(out), "--quiet"]
    result = CliRunner().invoke(convert_cli, args)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)  # no traceback
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert f"error: {odd}: " in lines[0] and said in lines[0]
    assert "gpt-2, qwen2, qwen35" in lines[0]
    assert not out.exists()
