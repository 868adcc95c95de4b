"""ninfer's built-in GLM-5 template (``templates/glm5_chat.jinja``): a conversation with tool
calls and results renders in GLM's format and reads back through the GLM parser to the same
messages; thinking on, off (also for a template that always opens ``<think>``) and effort
levels; and which built-in an artifact without a template gets."""

from __future__ import annotations

import json
import re

import pytest

from ninfer_runtime.errors import RequestError
from ninfer_runtime.frontend.chat_template import GLM_BUILTIN_TEMPLATE, ChatTemplate
from ninfer_runtime.frontend.parsers import OutputAccumulator, ParsedOutput
from ninfer_runtime.frontend.tokenizer import THINK_CLOSE, THINK_OPEN

from .history import assistant_message

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
        "strict": True,
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
ASSISTANT = {
    "role": "assistant",
    "reasoning_content": "Two lookups.",
    "content": "Checking both.",
    "tool_calls": [
        {
            "id": "a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
        },
        {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ],
}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather and time in Paris?"},
    ASSISTANT,
    {"role": "tool", "tool_call_id": "a", "content": "sunny"},
    {"role": "tool", "tool_call_id": "b", "content": "12:00"},
]


@pytest.fixture(scope="module")
def glm() -> ChatTemplate:
    return ChatTemplate.builtin(GLM_BUILTIN_TEMPLATE)


def test_a_tool_conversation_renders_in_glm_format(glm: ChatTemplate) -> None:
    text = glm.render(CONVERSATION, tools=TOOLS)
    assert text.startswith("[gMASK]<sop><|system|>Reasoning Effort: Max<|system|>\n# Tools")
    listed = re.findall(r"^\{.*\}$", text, re.MULTILINE)
    assert [json.loads(line)["name"] for line in listed] == ["get_weather", "get_time"]
    assert all("strict" not in json.loads(line) for line in listed)
    assert text.endswith(
        "<|system|>Be brief.<|user|>Weather and time in Paris?"
        "<|assistant|><think>Two lookups.</think>Checking both."
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"
        "<tool_call>get_time</tool_call>"
        "<|observation|><tool_response>sunny</tool_response><tool_response>12:00</tool_response>"
        "<|assistant|><think>"
    )


def test_the_rendered_assistant_turn_reads_back_to_the_message(glm: ChatTemplate) -> None:
    """What the template writes for an assistant turn is what the model would write; parsing
    it gives the message back, and the message renders to the same text again."""
    text = glm.render(CONVERSATION, tools=TOOLS)
    turn = text.split("<|assistant|>")[1].split("<|observation|>")[0]
    parsed = _parse(glm, turn)
    assert parsed.reasoning == ASSISTANT["reasoning_content"]
    assert parsed.content == ASSISTANT["content"]
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": 2}),
        ("get_time", {}),
    ]
    again = assistant_message(parsed)
    assert glm.render([*CONVERSATION[:2], again, *CONVERSATION[3:]], tools=TOOLS) == text


def _parse(glm: ChatTemplate, text: str) -> ParsedOutput:
    """The whole text through the parser of the template's family."""
    parser = glm.chat_format.output_parser(tools=TOOLS)
    out = OutputAccumulator()
    out.add(parser.feed(text))
    out.add(parser.finish())
    return out.result()


def test_thinking_on_off_and_effort_levels(glm: ChatTemplate) -> None:
    ask = [{"role": "user", "content": "hi"}]
    assert glm.render(ask).endswith("<|user|>hi<|assistant|><think>")
    off = glm.render(ask, enable_thinking=False)
    assert off.endswith("<|user|>hi/nothink<|assistant|><think></think>")
    already = glm.render([{"role": "user", "content": "hi /nothink"}], enable_thinking=False)
    assert already.count("/nothink") == 1
    for level in ("low", "high", "max"):
        text = glm.render(ask, chat_template_kwargs={"reasoning_effort": level})
        assert f"<|system|>Reasoning Effort: {level.capitalize()}<|user|>" in text
    with pytest.raises(RequestError, match="medium"):
        glm.render(ask, chat_template_kwargs={"reasoning_effort": "medium"})


def test_clear_thinking_drops_reasoning_before_the_latest_question(glm: ChatTemplate) -> None:
    later = [*CONVERSATION, {"role": "assistant", "content": "Sunny, noon."}]
    later.append({"role": "user", "content": "Thanks"})
    kept = glm.render(later, tools=TOOLS)
    assert "<think>Two lookups.</think>" in kept
    cleared = glm.render(later, tools=TOOLS, chat_template_kwargs={"clear_thinking": True})
    assert "Two lookups." not in cleared and "<|assistant|><think></think>Checking" in cleared


def test_thinking_off_closes_a_think_block_the_template_always_opens() -> None:
    """GLM-5 templates without a thinking switch end the prompt with ``<think>`` regardless."""
    always = ChatTemplate(
        "{% for m in messages %}<|user|>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|><think>{% endif %}"
    )
    ask = [{"role": "user", "content": "hi"}]
    assert always.render(ask).endswith(THINK_OPEN)
    assert always.render(ask, enable_thinking=False).endswith(THINK_OPEN + THINK_CLOSE)
    closed = always.render(ask, chat_template_kwargs={"enable_thinking": False})
    assert closed.endswith(THINK_OPEN + THINK_CLOSE)
    assert always.render(ask, enable_thinking=False, add_generation_prompt=False) == "<|user|>hi"
    qwen = ChatTemplate.builtin_chatml()  # closes the block itself: nothing is added
    assert qwen.render(ask, enable_thinking=False).endswith("<think>\n\n</think>\n\n")


def test_a_glm_template_without_a_switch_gets_nothink_on_user_turns() -> None:
    """GLM models were trained on thinking off as ``/nothink`` ending the user turn plus an empty
    think block; a GLM template with no switch of its own gets both from the frontend."""
    no_switch = ChatTemplate(
        "{# calls: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value> #}"
        "{% for m in messages %}<|{{ m.role }}|>{% if m.content is string %}{{ m.content }}"
        "{% else %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|><think>{% endif %}"
    )
    assert no_switch.chat_format.name == "glm" and no_switch.chat_format.no_think_suffix
    chat = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": [{"type": "text", "text": "c"}]},
    ]
    assert (
        no_switch.render(chat) == "<|system|>s<|user|>a<|assistant|>b<|user|>c<|assistant|><think>"
    )
    assert no_switch.render(chat, enable_thinking=False) == (
        "<|system|>s<|user|>a/nothink<|assistant|>b<|user|>c/nothink<|assistant|><think></think>"
    )
    assert chat[1]["content"] == "a"  # the caller's messages are left alone
    builtin = ChatTemplate.builtin(GLM_BUILTIN_TEMPLATE)  # has its own switch: left to it
    assert builtin.chat_format.no_think_suffix is None


def test_an_artifact_without_a_template_gets_the_builtin_of_its_family() -> None:
    assert ChatTemplate.from_resources({}, model_type="glm5_next").chat_format.name == "glm"
    assert ChatTemplate.from_resources({}, model_type="glm5_next_text").builtin
    assert ChatTemplate.from_resources({}, model_type="qwen3_5_text").chat_format.name == "qwen"
    own = {"chat_template.jinja": b"{% for m in messages %}{{ m.content }}{% endfor %}"}
    chosen = ChatTemplate.from_resources(own, model_type="glm5_next")
    assert not chosen.builtin and chosen.chat_format.name == "qwen"
