"""Reasoning effort, as the chat template of the model being served takes it.

The three APIs carry an effort level (Chat ``reasoning_effort``, Responses ``reasoning.effort``,
Anthropic ``output_config.effort``). ``none`` and ``minimal`` turn thinking off everywhere. The
other levels depend on the template (``ChatTemplate.chat_format``):

* a template with effort levels of its own (GLM-5: low, high, max) gets the level as its
  ``reasoning_effort`` variable (``xhigh`` is its max), and the level sets no thinking budget:
  the model paces its own reasoning. A level it has no equivalent for (``medium``) is refused,
  since such a template would silently render it as another level;
* any other template (Qwen) knows only thinking on or off, so the Chat and Responses handlers
  turn the level into a thinking budget (``EFFORT_BUDGETS`` in ``openai.reasoning_effort``).

A ``reasoning_effort`` the client set in ``chat_template_kwargs`` itself is left as given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ninfer_runtime.errors import RequestError
from ninfer_runtime.frontend.chat_format import ChatFormat

__all__ = ["THINKING_OFF", "Effort", "template_effort"]

#: effort levels that mean no reasoning at all
THINKING_OFF = ("none", "minimal")


@dataclass(frozen=True)
class Effort:
    """The effort a client asked for: ``value`` as sent, ``param`` the field it came in, and
    whether the job's thinking budget is the one derived from it (no explicit budget given)."""

    value: str
    param: str
    sets_budget: bool = False


def template_effort(
    effort: Effort | None, chat_format: ChatFormat, kwargs: Mapping[str, Any] | None
) -> tuple[Mapping[str, Any] | None, bool]:
    """(the template kwargs to render with, whether to drop the budget the effort set)."""
    if effort is None or effort.value in THINKING_OFF or not chat_format.effort_levels:
        return kwargs, False
    if kwargs and "reasoning_effort" in kwargs:
        return kwargs, effort.sets_budget
    level = chat_format.effort_level(effort.value)
    if level is None:
        levels = ", ".join([*chat_format.effort_levels, *THINKING_OFF])
        raise RequestError(
            f"{effort.param}: {effort.value!r} is not an effort this model's chat template takes "
            f"(it takes {levels})",
            param=effort.param,
            code="unsupported_parameter",
        )
    return {**(kwargs or {}), "reasoning_effort": level}, effort.sets_budget
