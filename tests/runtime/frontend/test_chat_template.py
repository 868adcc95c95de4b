"""Chat template: golden renderings of the built-in template, request errors, template choice."""

from __future__ import annotations

import json

import pytest

from ninfer_runtime.errors import EngineError, RequestError
from ninfer_runtime.frontend.chat_template import ChatTemplate, normalize_messages

from .history import assistant_message

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "reasoning_content": "Old thought.", "content": "Hello!"},
    {"role": "user", "content": "Weather in Paris & Rome?"},
    {
        "role": "assistant",
        "reasoning_content": "\nTwo cities, two calls.\n",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Rome", "x": {"u": 1}}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "22C"}]},
]

TOOLS_BLOCK = (
    "# Tools\n\n"
    "You can call the functions whose JSON signatures are listed inside <tools></tools>, "
    "one per line:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Current weather", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}, '
    '"days": {"type": "integer"}}, "required": ["city"]}}}\n'
    "</tools>\n\n"
    "To call a function, write a block of exactly this shape, with one <parameter> block per "
    "argument:\n"
    "<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n"
    "</tool_call>\n\n"
    "Rules:\n"
    "- Give every required argument. Write string values as plain text; write numbers, "
    "booleans, arrays and objects as JSON.\n"
    "- To call several functions, write one block after another.\n"
    "- Text before the first block is shown to the user; write nothing after the last block."
)

GOLDEN_HISTORY = (
    "<|im_start|>system\nYou are terse.\n\n" + TOOLS_BLOCK + "<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\nHello!<|im_end|>\n"
    "<|im_start|>user\nWeather in Paris & Rome?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nTwo cities, two calls.\n</think>\n\nChecking.\n\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
    '<parameter=x>\n{"u": 1}\n</parameter>\n</function>\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n"
    "<tool_response>\n22C\n</tool_response><|im_end|>\n"
)


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate.builtin_chatml()


# -- golden renderings --------------------------------------------------------------------------


def test_full_conversation_with_thinking(template: ChatTemplate) -> None:
    rendered = template.render(CONVERSATION, tools=TOOLS)
    assert rendered == GOLDEN_HISTORY + "<|im_start|>assistant\n<think>\n"


def test_full_conversation_without_thinking(template: ChatTemplate) -> None:
    rendered = template.render(CONVERSATION, tools=TOOLS, enable_thinking=False)
    assert rendered == GOLDEN_HISTORY + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    via_kwargs = template.render(
        CONVERSATION, tools=TOOLS, chat_template_kwargs={"enable_thinking": False}
    )
    assert via_kwargs == rendered


def test_no_generation_prompt(template: ChatTemplate) -> None:
    assert template.render(CONVERSATION, tools=TOOLS, add_generation_prompt=False) == GOLDEN_HISTORY


def test_plain_chat_without_tools(template: ChatTemplate) -> None:
    messages = [
        {"role": "developer", "content": "Be nice."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}],
        },
    ]
    assert template.render(messages) == (
        "<|im_start|>system\nBe nice.<|im_end|>\n"
        "<|im_start|>user\nHello there<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    assert template.render(messages[1:], add_generation_prompt=False) == (
        "<|im_start|>user\nHello there<|im_end|>\n"
    )


def test_tools_without_system_message(template: ChatTemplate) -> None:
    rendered = template.render([{"role": "user", "content": "Hi"}], tools=TOOLS)
    assert rendered.startswith("<|im_start|>system\n# Tools\n\n")
    assert rendered.endswith(
        "</tool_call>\n\nRules:\n"
        "- Give every required argument. Write string values as plain text; write numbers, "
        "booleans, arrays and objects as JSON.\n"
        "- To call several functions, write one block after another.\n"
        "- Text before the first block is shown to the user; write nothing after the last block."
        "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


def test_reasoning_of_earlier_turns(template: ChatTemplate) -> None:
    kept = template.render(
        CONVERSATION[:3],
        add_generation_prompt=False,
        chat_template_kwargs={"preserve_thinking": True},
    )
    assert "<|im_start|>assistant\n<think>\nOld thought.\n</think>\n\nHello!<|im_end|>" in kept
    dropped = template.render(CONVERSATION[:4], add_generation_prompt=False)
    assert "Old thought" not in dropped
    # the turn after the last user message always shows its (possibly empty) think block
    last = template.render(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],
        add_generation_prompt=False,
    )
    assert last.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nYo<|im_end|>\n")


def test_reasoning_inside_content_is_split(template: ChatTemplate) -> None:
    rendered = template.render(
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello"},
        ],
        add_generation_prompt=False,
    )
    assert rendered.endswith("<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHello<|im_end|>\n")


def test_reasoning_alias_and_bare_tool_schema(template: ChatTemplate) -> None:
    rendered = template.render(
        [
            {"role": "user", "content": "Hi"},
            {
                "role": "assistant",
                "reasoning": "r",
                "tool_calls": [{"name": "f", "arguments": {"b": True}}],
            },
        ],
        tools=[{"name": "f", "parameters": {"type": "object"}}],
        add_generation_prompt=False,
    )
    assert (
        '{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}'
        in rendered
    )
    assert rendered.endswith(
        "<|im_start|>assistant\n<think>\nr\n</think>\n\n"
        "<tool_call>\n<function=f>\n<parameter=b>\ntrue\n</parameter>\n</function>\n"
        "</tool_call><|im_end|>\n"
    )


def test_continue_final_message(template: ChatTemplate) -> None:
    rendered = template.render(
        [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}],
        add_generation_prompt=False,
        continue_final_message=True,
    )
    assert rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n1, 2,")


def test_input_messages_are_not_modified(template: ChatTemplate) -> None:
    before = json.dumps(CONVERSATION, sort_keys=True)
    template.render(CONVERSATION, tools=TOOLS)
    assert json.dumps(CONVERSATION, sort_keys=True) == before


def test_transformers_renders_it_the_same(template: ChatTemplate) -> None:
    """The environment follows HF conventions: transformers' own renderer gives the same text."""
    utils = pytest.importorskip("transformers.utils.chat_template_utils")
    from ninfer_runtime.frontend.chat_template import normalize_tools

    for thinking in (True, False):
        rendered, _ = utils.render_jinja_template(
            conversations=[normalize_messages(CONVERSATION)],
            tools=normalize_tools(TOOLS),
            chat_template=template.source,
            add_generation_prompt=True,
            enable_thinking=thinking,
        )
        assert rendered[0] == template.render(CONVERSATION, tools=TOOLS, enable_thinking=thinking)


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "param", "message"),
    [
        ([], "messages", "non-empty"),
        ([{"role": "robot", "content": "x"}], "messages[0].role", "'robot' is not one of"),
        ([{"content": "x"}], "messages[0].role", "role is missing"),
        ([{"role": "user"}], "messages[0].content", "content is missing"),
        ([{"role": "user", "content": 5}], "messages[0].content", "string or a list"),
        ([{"role": "assistant"}], "messages[0].content", "needs content, reasoning_content"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}],
            "messages[0].tool_calls[0].function.arguments",
            "not valid JSON",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}],
            "messages[0].tool_calls[0].function.name",
            "non-empty string",
        ),
        (["hello"], "messages[0]", "must be an object"),
    ],
)
def test_bad_messages(template: ChatTemplate, messages: list, param: str, message: str) -> None:
    with pytest.raises(RequestError, match=message) as info:
        template.render(messages)
    assert info.value.param == param


def test_bad_tools(template: ChatTemplate) -> None:
    with pytest.raises(RequestError, match=r"tools\[0\]\.function\.name") as info:
        template.render(
            [{"role": "user", "content": "x"}], tools=[{"type": "function", "function": {}}]
        )
    assert info.value.param == "tools[0].function.name"


def test_template_exception_becomes_request_error(template: ChatTemplate) -> None:
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(RequestError, match="image_url is not supported") as info:
        template.render(image)
    assert "Traceback" not in str(info.value)


def test_artifact_template_failure_is_named() -> None:
    broken = ChatTemplate("{{ messages[0].content.upper(1, 2, 3) }}")
    with pytest.raises(RequestError, match=r"chat template chat_template\.jinja failed"):
        broken.render([{"role": "user", "content": "x"}])
    with pytest.raises(EngineError, match="syntax error at line 1"):
        ChatTemplate("{% if %}")


def test_template_kwargs_conflicts(template: ChatTemplate) -> None:
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(RequestError, match="given twice") as info:
        template.render(
            messages, enable_thinking=True, chat_template_kwargs={"enable_thinking": False}
        )
    assert info.value.param == "enable_thinking"
    with pytest.raises(RequestError, match="may not set messages"):
        template.render(messages, chat_template_kwargs={"messages": []})
    with pytest.raises(RequestError, match="cannot both be set"):
        template.render(messages, continue_final_message=True)


# -- which template ------------------------------------------------------------------------------


def test_template_precedence() -> None:
    config = {"eos_token": "<|im_end|>", "bos_token": {"content": "<s>"}}
    resources = {"tokenizer_config.json": json.dumps(config).encode()}
    assert ChatTemplate.from_resources(resources).builtin
    embedded = {**config, "chat_template": "E{{ bos_token }}{{ eos_token }}"}
    resources["tokenizer_config.json"] = json.dumps(embedded).encode()
    assert ChatTemplate.from_resources(resources).render([{"role": "user", "content": "x"}]) == (
        "E<s><|im_end|>"
    )
    resources["chat_template.jinja"] = b"A{{ messages | length }}{{ enable_thinking }}"
    chosen = ChatTemplate.from_resources(resources)
    assert not chosen.builtin
    assert chosen.render([{"role": "user", "content": "x"}], enable_thinking=False) == "A1False"
    override = ChatTemplate.from_resources(resources, override="O")
    assert override.render([{"role": "user", "content": "x"}]) == "O"


def test_tojson_does_not_escape_html() -> None:
    template = ChatTemplate("{{ tools | tojson }}")
    tools = [{"name": "a<b>&c", "description": "é"}]
    assert template.render([{"role": "user", "content": "x"}], tools=tools) == (
        '[{"type": "function", "function": {"name": "a<b>&c", "description": "é"}}]'
    )


def test_parsed_reply_renders_back_to_what_the_model_wrote(template: ChatTemplate) -> None:
    """History re-rendered from the parsed reply extends the prompt + output verbatim, so the
    next turn's prompt shares the whole previous turn as a prefix (exact prefix reuse)."""
    from ninfer_runtime.frontend.parsers import parse_output, prompt_opens_reasoning

    user = {"role": "user", "content": "Weather in Paris?"}
    prompt = template.render([user], tools=TOOLS)
    output = (
        "The user wants Paris.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n"
        "</tool_call>"
    )
    parsed = parse_output(output, starts_in_reasoning=prompt_opens_reasoning(prompt), tools=TOOLS)
    reply = assistant_message(parsed)
    history = [user, reply, {"role": "tool", "content": "18C"}]
    assert template.render(history, tools=TOOLS).startswith(prompt + output + "<|im_end|>\n")
