"""GLM's ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`` calls:
single and parallel calls, the same calls whatever the deltas, malformed calls kept as text,
argument values typed by schema or read as JSON, and the template family that picks the parser."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ninfer_runtime.frontend.chat_format import GLM_EFFORT_LEVELS, detect_chat_format
from ninfer_runtime.frontend.chat_template import (
    BUILTIN_TEMPLATE,
    GLM_BUILTIN_TEMPLATE,
    builtin_template_source,
)
from ninfer_runtime.frontend.glm_tool_calls import GlmOutputParser, convert_glm_value
from ninfer_runtime.frontend.parsers import (
    OutputAccumulator,
    ParsedOutput,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "zip": {"type": "string"},
                "units": {"type": ["string", "null"]},
                "hourly": {"type": "boolean"},
                "spots": {"type": "array", "items": {"type": "string"}},
            },
        },
    },
}

TWO_CALLS = (
    "<think>The user wants weather.</think>Let me check."
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key><arg_value>3</arg_value>\n</tool_call>"
    "<tool_call>get_time<arg_key>zone</arg_key><arg_value>Europe/Paris</arg_value></tool_call>"
)


def _ids(index: int) -> str:
    return f"call_{index}"


def parse(pieces: list[str], *, cut_off: bool = False, **options: Any) -> ParsedOutput:
    parser = GlmOutputParser(call_id=_ids, **options)
    out = OutputAccumulator()
    for piece in pieces:
        out.add(parser.feed(piece))
    out.add(parser.finish(cut_off=cut_off))
    return out.result()


def calls(result: ParsedOutput) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, json.loads(c.arguments)) for c in result.tool_calls]


def test_single_and_parallel_calls() -> None:
    result = parse([TWO_CALLS])
    assert result.reasoning == "The user wants weather."
    assert result.content == "Let me check."
    assert calls(result) == [
        ("get_weather", {"city": "Paris", "days": 3}),
        ("get_time", {"zone": "Europe/Paris"}),
    ]
    assert [c.id for c in result.tool_calls] == ["call_0", "call_1"]
    assert not result.warnings


def test_a_call_without_arguments_and_text_after_it() -> None:
    result = parse(["<tool_call>list_files</tool_call>\nDone."])
    assert calls(result) == [("list_files", {})]
    assert result.content == "Done."


def test_a_call_inside_reasoning_is_a_call() -> None:
    text = "I should look.<tool_call>ls<arg_key>dir</arg_key><arg_value>.</arg_value></tool_call>"
    result = parse([text], starts_in_reasoning=True)
    assert result.reasoning == "I should look."
    assert calls(result) == [("ls", {"dir": "."})]


@pytest.mark.parametrize("stream", [True, False])
def test_every_split_gives_the_same_output(stream: bool) -> None:
    """One cut at every character, and one character a delta: the events fold to the same
    output as the whole text at once."""
    options = {"tools": [WEATHER], "stream_tool_calls": stream}
    whole = parse([TWO_CALLS], **options)
    for cut in range(1, len(TWO_CALLS)):
        assert parse([TWO_CALLS[:cut], TWO_CALLS[cut:]], **options) == whole, cut
    assert parse(list(TWO_CALLS), **options) == whole


def test_string_values_stream_before_the_call_ends() -> None:
    parser = GlmOutputParser(tools=[WEATHER], call_id=_ids)
    events = parser.feed("<tool_call>get_weather<arg_key>city</arg_key><arg_value>San Fr")
    assert events[0] == ToolCallStart(0, "call_0", "get_weather")
    streamed = "".join(e.text for e in events if isinstance(e, ToolCallArgumentsDelta))
    assert streamed == '{"city": "San Fr'
    rest = parser.feed("ancisco</arg_value></tool_call>") + parser.finish()
    streamed += "".join(e.text for e in rest if isinstance(e, ToolCallArgumentsDelta))
    assert json.loads(streamed) == {"city": "San Francisco"}
    assert rest[-1] == ToolCallEnd(0)


def test_argument_typing_by_schema() -> None:
    text = (
        "<tool_call>get_weather"
        "<arg_key>zip</arg_key><arg_value>00501</arg_value>"
        "<arg_key>days</arg_key><arg_value>7</arg_value>"
        "<arg_key>hourly</arg_key><arg_value>true</arg_value>"
        '<arg_key>spots</arg_key><arg_value>["a", "b"]</arg_value>'
        "<arg_key>units</arg_key><arg_value>null</arg_value>"
        "<arg_key>city</arg_key><arg_value>42</arg_value>"
        "</tool_call>"
    )
    (_, arguments), *_ = calls(parse([text], tools=[WEATHER]))
    assert arguments == {
        "zip": "00501",  # a string parameter stays text, leading zero and all
        "days": 7,
        "hourly": True,
        "spots": ["a", "b"],
        "units": None,
        "city": "42",
    }


def test_argument_values_without_a_schema_are_read_as_json() -> None:
    assert convert_glm_value("3", None) == 3
    assert convert_glm_value("2.5", {}) == 2.5
    assert convert_glm_value('{"a": [1, true]}', None) == {"a": [1, True]}
    assert convert_glm_value("false", None) is False
    assert convert_glm_value("Paris", None) == "Paris"
    assert convert_glm_value("[unclosed", None) == "[unclosed"
    assert convert_glm_value("12", {"type": "string"}) == "12"
    assert convert_glm_value("twelve", {"type": "integer"}) == "twelve"  # no fit: the text


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>not a name</tool_call>",  # spaces: prose, not a function name
        "<tool_call>f<arg_key>a</arg_key>oops<arg_value>1</arg_value></tool_call>",
        "<tool_call>f\nsome words</tool_call>",
        "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value>",  # never closed
    ],
)
def test_malformed_calls_stay_text(text: str) -> None:
    for stream in (True, False):
        result = parse(["Before. ", text], stream_tool_calls=stream)
        assert result.tool_calls == []
        assert result.content == "Before. " + text
        assert result.warnings


def test_a_valid_call_after_a_broken_one_is_still_read() -> None:
    good = "<tool_call>ok<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>"
    text = "<tool_call>bad name</tool_call>" + good
    result = parse([text])
    assert calls(result) == [("ok", {"x": 1})]
    assert result.content == "<tool_call>bad name</tool_call>"


def test_a_call_cut_off_in_a_string_value_keeps_its_text() -> None:
    text = "<tool_call>get_weather<arg_key>days</arg_key><arg_value>2</arg_value>"
    text += "<arg_key>city</arg_key><arg_value>Ber"
    result = parse([text], tools=[WEATHER], cut_off=True)
    assert calls(result) == [("get_weather", {"days": 2, "city": "Ber"})]
    assert result.tool_calls[0].cut_off and result.content == ""


def test_the_qwen_forms_are_still_read() -> None:
    """A forced ``tool_choice`` grammar writes the XML form; some models write JSON."""
    xml = (
        "<tool_call>\n<function=ls>\n<parameter=dir>\n/tmp\n</parameter>\n</function>\n</tool_call>"
    )
    as_json = '<tool_call>{"name": "ls", "arguments": {"dir": "/tmp"}}</tool_call>'
    assert calls(parse([xml])) == [("ls", {"dir": "/tmp"})]
    assert calls(parse([as_json])) == [("ls", {"dir": "/tmp"})]


def test_the_template_decides_the_family() -> None:
    glm = detect_chat_format(builtin_template_source(GLM_BUILTIN_TEMPLATE))
    assert glm.name == "glm" and glm.effort_levels == GLM_EFFORT_LEVELS
    assert isinstance(glm.output_parser(), GlmOutputParser)
    qwen = detect_chat_format(builtin_template_source(BUILTIN_TEMPLATE))
    assert qwen.name == "qwen" and qwen.effort_levels == ()
    assert not isinstance(qwen.output_parser(), GlmOutputParser)
    # a GLM-4.5-style template: the same calls, no effort levels
    older = "{{ '<tool_call>' + name }}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value>"
    assert detect_chat_format(older).name == "glm"
    assert detect_chat_format(older).effort_levels == ()
    assert glm.effort_level("xhigh") == "max" and glm.effort_level("medium") is None


def test_argument_tags_survive_skipping_special_tokens(tiny_resources) -> None:
    """GLM's vocabulary has the tags as added tokens: detokenizing with special tokens skipped
    (the default) still writes them, or no call could be read."""
    from tokenizers import Tokenizer as HfTokenizer

    from ninfer_runtime.frontend.tokenizer import Tokenizer

    backend = HfTokenizer.from_str(tiny_resources["tokenizer.json"].decode())
    backend.add_special_tokens(["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"])
    tokenizer = Tokenizer.from_resources(
        {**tiny_resources, "tokenizer.json": backend.to_str().encode()}
    )
    text = "<tool_call>ls<arg_key>dir</arg_key><arg_value>/tmp</arg_value></tool_call><|im_end|>"
    ids = tokenizer.encode(text)
    assert tokenizer.token_id("<arg_key>") in ids
    stream = tokenizer.detokenize_stream(skip_special_tokens=True)
    written = "".join(stream.add(i) for i in ids) + stream.flush()
    assert written == text.removesuffix("<|im_end|>")
    assert calls(parse([written])) == [("ls", {"dir": "/tmp"})]
