"""Output parser: every split point of several outputs assembles to the same, expected result."""

from __future__ import annotations

import json

import pytest

from ninfer_runtime.frontend.parsers import (
    OutputAccumulator,
    OutputParser,
    ParsedOutput,
    ParseWarning,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
    convert_parameter,
    parse_output,
    prompt_opens_reasoning,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                    "opts": {"type": "object"},
                },
            },
        },
    },
    {"name": "write_file", "parameters": {"properties": {"path": {}, "body": {"type": "string"}}}},
]


def ids(index: int) -> str:
    return f"call_{index}"


def assemble(chunks: list[str], **options: object) -> tuple[ParsedOutput, list]:
    parser = OutputParser(tools=TOOLS, call_id=ids, **options)
    accumulator = OutputAccumulator()
    events = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.finish()
    accumulator.add(events)
    return accumulator.result(), events


def summary(result: ParsedOutput) -> tuple:
    calls = [(c.index, c.name, json.loads(c.arguments)) for c in result.tool_calls]
    return result.reasoning, result.content, calls, [w.reason for w in result.warnings]


def check_every_split(text: str, expected: tuple, **options: object) -> None:
    """Whole, every two-piece split, and character by character; streaming and held calls."""
    for stream in (True, False):
        opts = {**options, "stream_tool_calls": stream}
        splits = [[text]] + [[text[:cut], text[cut:]] for cut in range(1, len(text))]
        splits.append(list(text))
        for chunks in splits:
            result, events = assemble(chunks, **opts)
            assert summary(result) == expected, (stream, chunks[:1])
            for call in result.tool_calls:
                assert isinstance(json.loads(call.arguments), dict)
            _check_event_order(events)


def _check_event_order(events: list) -> None:
    open_calls: set[int] = set()
    for event in events:
        if isinstance(event, ToolCallStart):
            open_calls.add(event.index)
        elif isinstance(event, ToolCallArgumentsDelta):
            assert event.index in open_calls
        elif isinstance(event, ToolCallEnd | ParseWarning) and event.index is not None:
            open_calls.remove(event.index)
        elif isinstance(event, ReasoningDelta | TextDelta):
            assert event.text
    assert not open_calls


REASONING_THEN_XML = (
    "The user wants weather.\nI will call the tool.\n</think>\n\nLet me check.\n\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nfalse\n</parameter>\n"
    "</function>\n</tool_call>"
)


def test_reasoning_then_xml_call() -> None:
    expected = (
        "The user wants weather.\nI will call the tool.",
        "Let me check.",
        [(0, "get_weather", {"city": "New York", "days": 3, "metric": False})],
        [],
    )
    check_every_split(REASONING_THEN_XML, expected, starts_in_reasoning=True)


def test_model_opened_think_and_json_call() -> None:
    text = (
        "<think>\nShort.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n'
        "</tool_call>"
    )
    expected = ("Short.", "", [(0, "get_weather", {"city": "Rome", "days": 2})], [])
    check_every_split(text, expected)


def test_call_written_inside_reasoning_is_not_lost() -> None:
    text = (
        "I need the weather first.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
        "Oslo\n</parameter>\n</function>\n</tool_call>\nThen answer."
    )
    expected = (
        "I need the weather first.\nThen answer.",
        "",
        [(0, "get_weather", {"city": "Oslo"})],
        [],
    )
    check_every_split(text, expected, starts_in_reasoning=True)


def test_text_then_call_without_newline_and_two_calls() -> None:
    text = (
        "Sure.<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=opts>\n{'unit': 'C', 'alerts': True}\n</parameter>\n</function>\n</tool_call>\n"
        '<tool_call>\n{"name": "write_file", "arguments": "{\\"path\\": \\"a.txt\\"}"}\n'
        "</tool_call>"
    )
    expected = (
        "",
        "Sure.",
        [
            (0, "get_weather", {"city": "Paris", "opts": {"unit": "C", "alerts": True}}),
            (1, "write_file", {"path": "a.txt"}),
        ],
        [],
    )
    check_every_split(text, expected)


def test_string_values_stream_and_keep_their_text() -> None:
    body = 'line "one"\n\tline <two> </param\n'
    text = (
        "<tool_call>\n<function=write_file>\n<parameter=path>\n42\n</parameter>\n"
        f"<parameter=body>\n{body}\n</parameter>\n</function>\n</tool_call>"
    )
    expected = ("", "", [(0, "write_file", {"path": "42", "body": body})], [])
    check_every_split(text, expected)
    # the string value streams before its parameter closes
    parser = OutputParser(tools=TOOLS, call_id=ids)
    events = parser.feed(text[: text.index("<two>")])
    deltas = [e.text for e in events if isinstance(e, ToolCallArgumentsDelta)]
    assert "".join(deltas) == '{"path": "42", "body": "line \\"one\\"\\n\\tline '


def test_several_functions_in_one_block_and_empty_arguments() -> None:
    text = (
        "<tool_call>\n<function=get_weather>\n</function>\n"
        "<function=write_file>\n<parameter=path>\nx\n</parameter>\n</function>\n</tool_call>"
    )
    expected = ("", "", [(0, "get_weather", {}), (1, "write_file", {"path": "x"})], [])
    check_every_split(text, expected)


@pytest.mark.parametrize(
    ("text", "content", "reason"),
    [
        (
            "Hi <tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
            "Hi <tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
            "tool call not closed at end of output",
        ),
        (
            'Hi <tool_call>\n{"name": "x", bad}\n</tool_call> after',
            'Hi <tool_call>\n{"name": "x", bad}\n</tool_call> after',
            "tool call JSON is invalid (Expecting property name enclosed in double quotes at 14)",
        ),
        (
            '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>',
            '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>',
            "tool call JSON has no function name",
        ),
        (
            "<tool_call>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
            "<tool_call>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
            "tool call has neither a <function=NAME> header nor a JSON object",
        ),
        (
            "<tool_call>\n<function=get weather>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get weather>\n</function>\n</tool_call>",
            "invalid function name 'get weather'",
        ),
        (
            "<tool_call>\n<function=get_weather>\noops\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\noops\n</function>\n</tool_call>",
            "unexpected text inside <function=get_weather>",
        ),
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ro',
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ro',
            "tool call not closed at end of output",
        ),
    ],
)
def test_malformed_calls_fall_back_to_text(text: str, content: str, reason: str) -> None:
    check_every_split(text, ("", content, [], [reason]))


def test_broken_call_then_a_good_one() -> None:
    text = (
        "<tool_call>\nnope\n<tool_call>\n<function=get_weather>\n<parameter=days>\n1\n"
        "</parameter>\n</function>\n</tool_call>"
    )
    reason = "tool call has neither a <function=NAME> header nor a JSON object"
    expected = ("", "<tool_call>\nnope", [(0, "get_weather", {"days": 1})], [reason])
    check_every_split(text, expected)


def test_complete_calls_missing_their_close_tags_are_kept() -> None:
    no_close = "<tool_call>\n<function=get_weather>\n<parameter=days>\n1\n</parameter>\n</function>"
    check_every_split(no_close, ("", "", [(0, "get_weather", {"days": 1})], []))
    json_open = '<tool_call>\n{"name": "get_weather", "arguments": {}}'
    check_every_split(json_open, ("", "", [(0, "get_weather", {})], []))


def test_abandoned_streamed_call_is_flagged_by_index() -> None:
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"
    _, events = assemble([text], stream_tool_calls=True)
    assert events[0] == ToolCallStart(0, "call_0", "get_weather")
    warning = next(e for e in events if isinstance(e, ParseWarning))
    assert warning.index == 0
    assert not any(isinstance(e, ToolCallEnd) for e in events)
    _, held = assemble([text], stream_tool_calls=False)
    assert not any(isinstance(e, ToolCallStart) for e in held)
    assert next(e for e in held if isinstance(e, ParseWarning)).index is None


def test_only_the_ambiguous_suffix_is_held() -> None:
    parser = OutputParser()
    assert parser.feed("Hello wor") == [TextDelta("Hello wor")]
    assert parser.feed("ld <to") == [TextDelta("ld")]  # "<to" may start <tool_call>
    assert parser.feed("y>") == [TextDelta(" <toy>")]
    assert parser.feed(" a<") == [TextDelta(" a")]
    assert parser.feed("/thin") == []
    assert parser.feed("g") == [TextDelta("</thing")]
    assert parser.finish() == []


def test_options_turn_parsing_off() -> None:
    text = "<think>x</think><tool_call>\n<function=f>\n</function>\n</tool_call>"
    result = parse_output(text, parse_reasoning=False, parse_tool_calls=False)
    assert (result.reasoning, result.content, result.tool_calls) == ("", text, [])


def test_stray_think_close_is_dropped_with_a_warning() -> None:
    result = parse_output("Answer.</think> More.")
    assert result.content == "Answer. More."
    assert [w.reason for w in result.warnings] == ["stray </think> outside reasoning was dropped"]


def test_parameter_conversion_by_schema() -> None:
    assert convert_parameter("42", {"type": "integer"}) == 42
    assert convert_parameter("4.0", {"type": "integer"}) == 4
    assert convert_parameter("-1.5e2", {"type": "number"}) == -150.0
    assert convert_parameter("True", {"type": "boolean"}) is True
    assert convert_parameter("[1, 2]", {"type": "array"}) == [1, 2]
    assert convert_parameter('{"a": null}', {"type": "object"}) == {"a": None}
    assert convert_parameter("null", {"type": ["integer", "null"]}) is None
    assert convert_parameter("7", {"anyOf": [{"type": "integer"}, {"type": "null"}]}) == 7
    assert convert_parameter("007", {"type": "string"}) == "007"
    assert convert_parameter("007", None) == "007"  # no schema: the text stays text
    assert convert_parameter("seven", {"type": "integer"}) == "seven"  # unreadable: kept
    assert convert_parameter("12", {"type": ["string", "integer"]}) == "12"


def test_prompt_opens_reasoning() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")
