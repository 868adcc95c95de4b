"""A tool_choice the request's tools cannot honour is one 400 in both OpenAI APIs."""

from __future__ import annotations

import pytest

from ninfer_serve.errors import ApiError
from ninfer_serve.openai.chat import to_job as chat_job
from ninfer_serve.openai.models import ChatCompletionRequest
from ninfer_serve.openai.tool_choice import check_tool_choice

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("choice", "tools", "message"),
    [
        ("forecast", [WEATHER], "tool_choice names 'forecast', which is not in tools"),
        ("required", [], "tool_choice 'required' needs tools"),
    ],
)
def test_a_choice_the_tools_cannot_honour_is_refused(choice, tools, message) -> None:
    with pytest.raises(ApiError) as refused:
        check_tool_choice(choice, tools)
    assert refused.value.status == 400 and refused.value.code == "invalid_tool_choice"
    assert message in str(refused.value)


@pytest.mark.parametrize("choice", ["auto", "none", "required", "weather"])
def test_a_choice_the_tools_honour_passes(choice) -> None:
    check_tool_choice(choice, [WEATHER])


def test_chat_names_the_field() -> None:
    body = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "forecast"}},
        }
    )
    with pytest.raises(ApiError) as refused:
        chat_job(body)
    assert refused.value.param == "tool_choice"
