"""A limit (max_tokens, the context) that cuts a tool call off never leaves markup as text."""

from __future__ import annotations

import json

import pytest

from ninfer_runtime.frontend.parsers import (
    OutputAccumulator,
    OutputParser,
    ParsedOutput,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)

from .test_parsers import TOOLS, ids

CALL = (
    "<think>\nok\n</think>\n\nSure.\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n12\n</parameter>\n"
    "</function>\n</tool_call>"
)


def cut(text: str, *, stream: bool, step: int) -> tuple[ParsedOutput, list]:
    parser = OutputParser(
        starts_in_reasoning=False, tools=TOOLS, call_id=ids, stream_tool_calls=stream
    )
    events: list = []
    for at in range(0, len(text), step):
        events += parser.feed(text[at : at + step])
    events += parser.finish(cut_off=True)
    accumulator = OutputAccumulator()
    accumulator.add(events)
    return accumulator.result(), events


@pytest.mark.parametrize("end", range(len(CALL) + 1))
def test_every_cut_point(end: int) -> None:
    text = CALL[:end]
    results = [cut(text, stream=stream, step=step) for stream in (True, False) for step in (1, 7)]
    first, events = results[0]
    for result, _ in results[1:]:
        assert result == first, "streamed, held and differently split outputs agree"
    assert "<" not in first.content and "<" not in first.reasoning
    assert "Sure.".startswith(first.content)
    for call in first.tool_calls:
        arguments = json.loads(call.arguments)
        assert set(arguments) <= {"city", "days"}
        assert "New York".startswith(arguments.get("city", ""))
        assert arguments.get("days", 12) == 12
    # the events a stream sent describe exactly the calls of the result
    started = {e.index for e in events if isinstance(e, ToolCallStart)}
    ended = {e.index for e in events if isinstance(e, ToolCallEnd)}
    assert started == ended == {c.index for c in first.tool_calls}
    joined = "".join(e.text for e in events if isinstance(e, ToolCallArgumentsDelta))
    assert joined == "".join(c.arguments for c in first.tool_calls)
    named = end >= CALL.index("get_weather>") + len("get_weather>")
    assert len(first.tool_calls) == (1 if named else 0)


def test_an_unfinished_string_keeps_its_text_and_other_values_are_left_out() -> None:
    at_city = CALL.index("York")
    result, _ = cut(CALL[:at_city], stream=True, step=3)
    assert json.loads(result.tool_calls[0].arguments) == {"city": "New "}
    at_days = CALL.index("12") + 1
    result, _ = cut(CALL[:at_days], stream=True, step=3)
    assert json.loads(result.tool_calls[0].arguments) == {"city": "New York"}


def test_a_natural_end_still_falls_back_to_text() -> None:
    text = CALL[: CALL.index("York")]
    parser = OutputParser(tools=TOOLS, call_id=ids)
    events = parser.feed(text) + parser.finish()
    accumulator = OutputAccumulator()
    accumulator.add(events)
    assert "<tool_call>" in accumulator.result().content


def test_a_partial_marker_is_not_left_as_text() -> None:
    parser = OutputParser()
    events = parser.feed("Hello <tool_ca") + parser.finish(cut_off=True)
    accumulator = OutputAccumulator()
    accumulator.add(events)
    assert accumulator.result().content == "Hello"
