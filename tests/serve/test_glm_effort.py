"""Reasoning effort as the served model's template takes it (``ninfer_serve.effort``): a GLM-5
template gets the level as ``reasoning_effort`` and no budget derived from it, a Qwen template
gets the budget, a level GLM has no equivalent for is one 400; in process, through the job and
the request the generator builds (the engine is a stand-in holding the template)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from ninfer_runtime.errors import RequestError
from ninfer_runtime.frontend.chat_template import GLM_BUILTIN_TEMPLATE, ChatTemplate
from ninfer_serve.anthropic.messages import to_job as anthropic_job
from ninfer_serve.anthropic.models import MessagesRequest
from ninfer_serve.generation import Generator
from ninfer_serve.openai.chat import EFFORT_BUDGETS
from ninfer_serve.openai.chat import to_job as chat_job
from ninfer_serve.openai.models import ChatCompletionRequest

ASK = [{"role": "user", "content": "hi"}]


def _generator(template: ChatTemplate) -> Generator:
    engine = SimpleNamespace(template=template, tokenizer=SimpleNamespace(generation_defaults={}))
    loop = SimpleNamespace(engine=engine, check_available=lambda: None)
    return Generator(loop, default_max_tokens=None, enable_thinking=None, keepalive=5)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def glm() -> Generator:
    return _generator(ChatTemplate.builtin(GLM_BUILTIN_TEMPLATE))


@pytest.fixture(scope="module")
def qwen() -> Generator:
    return _generator(ChatTemplate.builtin_chatml())


def _chat(generator: Generator, **fields: Any):
    return generator._request(chat_job(ChatCompletionRequest(messages=ASK, **fields)))


@pytest.mark.parametrize(("effort", "level"), [("low", "low"), ("high", "high"), ("xhigh", "max")])
def test_glm_takes_the_level_and_no_budget(glm: Generator, effort: str, level: str) -> None:
    request = _chat(glm, reasoning_effort=effort)
    assert request.chat_template_kwargs == {"reasoning_effort": level}
    assert request.enable_thinking is True
    assert request.sampling.max_thinking_tokens is None
    prompt = glm.engine.template.render(
        ASK, enable_thinking=True, chat_template_kwargs=request.chat_template_kwargs
    )
    assert f"Reasoning Effort: {level.capitalize()}<|user|>" in prompt


def test_qwen_takes_a_budget(qwen: Generator) -> None:
    request = _chat(qwen, reasoning_effort="low")
    assert request.chat_template_kwargs is None
    assert request.sampling.max_thinking_tokens == EFFORT_BUDGETS["low"]


def test_an_effort_glm_cannot_take_is_refused(glm: Generator) -> None:
    with pytest.raises(RequestError, match=r"reasoning_effort: 'medium' is not an effort") as exc:
        _chat(glm, reasoning_effort="medium")
    assert exc.value.code == "unsupported_parameter" and exc.value.param == "reasoning_effort"
    with pytest.raises(RequestError) as exc:
        glm._request(
            anthropic_job(
                MessagesRequest(
                    model="m", messages=ASK, max_tokens=99, output_config={"effort": "medium"}
                )
            )
        )
    assert exc.value.param == "output_config.effort"


def test_no_effort_turns_thinking_off_and_the_prompt_closes_the_block(glm: Generator) -> None:
    for effort in ("none", "minimal"):
        request = _chat(glm, reasoning_effort=effort)
        assert request.enable_thinking is False and request.chat_template_kwargs is None
        prompt = glm.engine.template.render(ASK, enable_thinking=request.enable_thinking)
        assert prompt.endswith("<|assistant|><think></think>")


def test_explicit_settings_win(glm: Generator) -> None:
    explicit = _chat(glm, reasoning_effort="high", max_thinking_tokens=77)
    assert explicit.sampling.max_thinking_tokens == 77
    assert explicit.chat_template_kwargs == {"reasoning_effort": "high"}
    given = _chat(glm, reasoning_effort="low", chat_template_kwargs={"reasoning_effort": "high"})
    assert given.chat_template_kwargs == {"reasoning_effort": "high"}
    assert given.sampling.max_thinking_tokens is None


def test_anthropic_effort_and_thinking(glm: Generator) -> None:
    def request(**fields: Any):
        body = MessagesRequest(model="m", messages=ASK, max_tokens=99, **fields)
        return glm._request(anthropic_job(body))

    adaptive = request(thinking={"type": "adaptive"}, output_config={"effort": "max"})
    assert adaptive.enable_thinking is True
    assert adaptive.chat_template_kwargs == {"reasoning_effort": "max"}
    plain = request()  # Anthropic's default: no thinking
    assert plain.enable_thinking is False and plain.chat_template_kwargs is None
