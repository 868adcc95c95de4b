"""The engine's vLLM sampling switches on the bundled model: ``min_tokens`` (no EOS, stop token
or stop string before that many tokens), ``skip_special_tokens``, and prompts without the
generation prompt. The bundled model answers "Hi" with five tokens and an end of turn."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_convert.pipeline import convert
from ninfer_runtime.engine import Engine, Finished, GenerationRequest, OutputEvent, TokenEvent
from ninfer_runtime.errors import RequestError
from ninfer_runtime.frontend import SamplingParams, StopMatcher, TextDelta
from tests.bundled import BUNDLED

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    out = tmp_path_factory.mktemp("min_tokens") / "tiny.ninfer"
    convert("qwen3_5_bf16", {"base": str(BUNDLED)}, out)
    return Engine(out, max_context=256)


def run(engine: Engine, messages=HI, processor=None, **sampling) -> tuple[list[int], str, Finished]:
    request = GenerationRequest(
        messages=messages,
        enable_thinking=False,
        logits_processor=processor,
        sampling=SamplingParams(**{"temperature": 0.0, "max_tokens": 40, **sampling}),
    )
    ids, text, finished = [], [], None
    for event in engine.generate(request):
        if isinstance(event, TokenEvent):
            ids.append(event.token_id)
        elif isinstance(event, OutputEvent) and isinstance(event.event, TextDelta):
            text.append(event.event.text)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    return ids, "".join(text), finished


def test_min_tokens_holds_back_the_end_of_turn(engine: Engine) -> None:
    ids, text, finished = run(engine)
    assert (text, len(ids), finished.stop.kind) == ("Blue is a color.", 5, "eos")
    eos = set(engine.tokenizer.eos_token_ids)
    for seed, temperature in [(0, 0.0), (1, 0.7), (2, 1.0)]:
        ids, _, finished = run(engine, min_tokens=12, seed=seed, temperature=temperature)
        assert len(ids) >= 12 and finished.usage.completion_tokens == len(ids)
        assert not eos.intersection(ids[:12])
        assert finished.reason == "stop" or len(ids) == 40


def test_min_tokens_holds_back_stop_tokens_and_stop_strings(engine: Engine) -> None:
    period = engine.tokenizer.encode(".")[0]
    ids, text, finished = run(engine, stop_token_ids=[period])
    assert len(ids) == 4 and finished.stop.value == period
    ids, text, finished = run(engine, stop_token_ids=[period], min_tokens=6)
    assert period not in ids[:6] and len(ids) >= 6
    # "color" ends the text at token 4; with min_tokens it is written, and a later one stops it
    ids, text, finished = run(engine, stop=["color"])
    assert (text, len(ids)) == ("Blue is a", 4)
    ids, text, finished = run(engine, stop=["color"], min_tokens=12)
    assert text.startswith("Blue is a color.") and len(ids) >= 12
    assert (finished.stop.kind, finished.stop.value) == ("stop_string", "color")
    assert text.count("color") == 1  # the stop string that ended it is cut


def test_a_grammar_that_admits_only_the_end_wins(engine: Engine) -> None:
    eos = engine.tokenizer.eos_token_ids[0]

    def only_eos(logits: np.ndarray, answer: list[int]) -> np.ndarray:
        out = np.full_like(logits, -np.inf)
        out[eos] = 0.0
        return out

    ids, text, finished = run(engine, processor=only_eos, min_tokens=5)
    assert (ids, text, finished.stop.kind) == ([], "", "eos")


def test_special_tokens_show_when_not_skipped(engine: Engine) -> None:
    _, skipped, _ = run(engine, ignore_eos=True, max_tokens=12)
    _, shown, _ = run(engine, ignore_eos=True, max_tokens=12, skip_special_tokens=False)
    assert "<|im_end|>" in shown and "<|im_start|>" in shown
    assert "<|" not in skipped and skipped.startswith("Blue is a color.")


def test_the_prompt_may_end_without_the_generation_prompt(engine: Engine) -> None:
    def prompt(**fields) -> str:
        ids, _ = engine.render(GenerationRequest(messages=HI, enable_thinking=False, **fields))
        return engine.tokenizer.decode(ids)

    assert prompt().endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert prompt(add_generation_prompt=False).endswith("Hi<|im_end|>\n")


def test_min_tokens_is_checked() -> None:
    with pytest.raises(RequestError, match="min_tokens must be >= 0"):
        SamplingParams(min_tokens=-1)
    with pytest.raises(RequestError, match=r"min_tokens \(9\) must not exceed max_tokens \(8\)"):
        SamplingParams(min_tokens=9, max_tokens=8)
    with pytest.raises(RequestError, match="skip_special_tokens must be true or false"):
        SamplingParams(skip_special_tokens=1)  # type: ignore[arg-type]


def test_a_stop_string_that_straddles_min_tokens_is_found() -> None:
    stops = StopMatcher(["<end>"])
    # before min_tokens: a whole stop string passes, a possible start of one is held back
    assert stops.feed("a <end> b <e", matching=False).text == "a <end> b "
    assert stops.held == "<e"
    step = stops.feed("nd> c")
    assert (step.text, step.stop.value) == ("", "<end>")
