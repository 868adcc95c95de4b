"""Streaming detokenization gives exactly the one-shot decode, whatever the decoder."""

from __future__ import annotations

import json

import pytest

from ninfer_runtime.frontend.tokenizer import Tokenizer

TEXT = "naïve café 你好，世界 🎉👩‍👩‍👧 ok"


def _streamed(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    stream = tokenizer.detokenize_stream()
    return [stream.add(i) for i in ids] + [stream.flush()]


def _byte_fallback_tokenizer() -> Tokenizer:
    """A SentencePiece-style vocabulary: a few words, the rest spelled as ``<0xNN>`` bytes."""
    from tokenizers import Tokenizer as Backend

    pieces = ["<unk>", "▁", "▁ok", "n", "a", "v", "e", "c", "f", "é"]
    vocab = {p: i for i, p in enumerate(pieces)}
    vocab.update({f"<0x{b:02X}>": len(pieces) + b for b in range(256)})
    spec = {
        "version": "1.0",
        "added_tokens": [],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": None,
        "model": {
            "type": "BPE",
            "vocab": vocab,
            "merges": [],
            "byte_fallback": True,
            "unk_token": "<unk>",
            "fuse_unk": True,
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
    }
    return Tokenizer(Backend.from_str(json.dumps(spec)))


def test_byte_level_stream_equals_one_shot_decode(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode(TEXT)
    deltas = _streamed(tiny_tokenizer, ids)
    assert "".join(deltas) == tiny_tokenizer.decode(ids) == TEXT
    assert all("\ufffd" not in d for d in deltas)
    assert sum(1 for d in deltas if d == "") > 1, "the emoji must span several byte tokens"


def test_byte_fallback_stream_equals_one_shot_decode() -> None:
    tokenizer = _byte_fallback_tokenizer()
    ids = tokenizer.encode(TEXT)
    assert sum(i >= 10 for i in ids) > 8, "the CJK and emoji must come as byte-fallback tokens"
    deltas = _streamed(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids)
    assert "你好，世界 🎉" in "".join(deltas)
    assert all("\ufffd" not in d for d in deltas)


@pytest.mark.parametrize("make", ["byte_level", "byte_fallback"])
def test_incomplete_character_at_the_end_is_flushed(make: str, tiny_tokenizer: Tokenizer) -> None:
    tokenizer = tiny_tokenizer if make == "byte_level" else _byte_fallback_tokenizer()
    ids = tokenizer.encode("ok 🎉")
    stream = tokenizer.detokenize_stream()
    text = "".join(stream.add(i) for i in ids[:-1])  # the emoji's last byte never comes
    assert text.strip() == "ok"
    tail = stream.flush()
    assert tail and set(tail) == {"\ufffd"}
    assert text + tail == tokenizer.decode(ids[:-1])


def test_an_invalid_byte_does_not_stall_the_stream(tiny_tokenizer: Tokenizer) -> None:
    first = tiny_tokenizer.encode("🎉")[0]  # a lead byte with no continuation
    ids = [first, *tiny_tokenizer.encode(" and more text")]
    deltas = _streamed(tiny_tokenizer, ids)
    assert "".join(deltas) == tiny_tokenizer.decode(ids)
    assert deltas[-1] == "", "everything came out before the end"
