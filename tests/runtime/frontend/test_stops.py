"""Stops: stop strings across token boundaries with hold-back, stop ids and EOS."""

from __future__ import annotations

import pytest

from ninfer_runtime.frontend.parsers import OutputAccumulator, OutputParser
from ninfer_runtime.frontend.sampling import SamplingParams
from ninfer_runtime.frontend.stops import StopMatcher, StopReason
from ninfer_runtime.frontend.tokenizer import Tokenizer


def stream(matcher: StopMatcher, pieces: list[str]) -> tuple[list[str], StopReason | None]:
    shown = []
    for piece in pieces:
        step = matcher.feed(piece)
        shown.append(step.text)
        if step.stop is not None:
            return shown, step.stop
    shown.append(matcher.flush())
    return shown, None


def test_stop_string_spanning_tokens_is_never_shown() -> None:
    matcher = StopMatcher(["</answer>"])
    shown, stop = stream(matcher, ["The result is 4", "</ans", "wer", ">", " ignored"])
    assert shown == ["The result is 4", "", "", ""]
    assert stop == StopReason("stop_string", "</answer>")


def test_only_the_possible_prefix_is_held() -> None:
    matcher = StopMatcher(["STOP", "xyz"])
    assert matcher.feed("abc ST").text == "abc "
    assert matcher.held == "ST"
    assert matcher.feed("ART x").text == "START "  # "STA" cannot become "STOP"
    assert matcher.held == "x"
    assert matcher.feed("yw").text == "xyw"
    assert matcher.flush() == ""


def test_held_text_is_released_at_the_end() -> None:
    matcher = StopMatcher(["\n\nUser:"])
    assert stream(matcher, ["Bye.", "\n", "\nUse"]) == (["Bye.", "", "", "\n\nUse"], None)


def test_every_split_gives_the_same_cut() -> None:
    text = "alpha beta ###gamma"
    for include in (False, True):
        expected = "alpha beta ###" if include else "alpha beta "
        for cut in range(len(text) + 1):
            matcher = StopMatcher(["###", "gamma"], include_stop_str_in_output=include)
            shown, stop = stream(matcher, [text[:cut], text[cut:]])
            assert "".join(shown) == expected
            assert stop == StopReason("stop_string", "###")


def test_first_completed_match_wins() -> None:
    # "b" completes before "abc" would, whatever the chunking
    for pieces in (["abc"], ["a", "b", "c"]):
        shown, stop = stream(StopMatcher(["abc", "b"]), pieces)
        assert ("".join(shown), stop) == ("a", StopReason("stop_string", "b"))
    # same end: the longer (earlier-starting) one
    shown, stop = stream(StopMatcher(["c", "abc"]), ["xabc"])
    assert ("".join(shown), stop) == ("x", StopReason("stop_string", "abc"))


def test_stop_ids_and_eos() -> None:
    matcher = StopMatcher(stop_token_ids=[5], eos_token_ids=[2, 3])
    assert matcher.check_token(7) is None
    assert matcher.check_token(3) == StopReason("eos", 3)
    assert StopMatcher(stop_token_ids=[5]).check_token(5) == StopReason("stop_token", 5)
    assert StopMatcher(eos_token_ids=[2], ignore_eos=True).check_token(2) is None


def test_from_params_and_no_feeding_after_a_stop() -> None:
    params = SamplingParams(stop=["!"], stop_token_ids=[9], include_stop_str_in_output=True)
    matcher = StopMatcher.from_params(params, eos_token_ids=[1])
    assert matcher.check_token(9) == StopReason("stop_token", 9)
    matcher = StopMatcher.from_params(params, eos_token_ids=[1])
    assert matcher.feed("Hi! there").text == "Hi!"
    with pytest.raises(RuntimeError, match="after the request stopped"):
        matcher.feed("more")


def test_pipeline_on_the_real_vocabulary(qwen_tokenizer: Tokenizer) -> None:
    """ids -> stop ids -> detokenize -> stop strings -> parser, as the engine runs it."""
    output = (
        "Plan: call it.\n</think>\n\nOK 🎉\n\n<tool_call>\n<function=f>\n<parameter=q>\n"
        "café\n</parameter>\n</function>\n</tool_call>"
    )
    ids = [*qwen_tokenizer.encode(output + "\nEND trailing"), qwen_tokenizer.special.im_end]
    matcher = StopMatcher(["\nEND"], eos_token_ids=qwen_tokenizer.eos_token_ids)
    detok = qwen_tokenizer.detokenize_stream(skip_special_tokens=True)
    parser = OutputParser(starts_in_reasoning=True, call_id=str)
    accumulator = OutputAccumulator()
    for token in ids:
        if matcher.check_token(token):
            break
        step = matcher.feed(detok.add(token))
        accumulator.add(parser.feed(step.text))
        if step.stop:
            break
    accumulator.add(parser.finish())
    result = accumulator.result()
    assert matcher.stopped == StopReason("stop_string", "\nEND")
    assert (result.reasoning, result.content) == ("Plan: call it.", "OK 🎉")
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("f", '{"q": "café"}')]
