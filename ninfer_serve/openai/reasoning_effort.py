"""A ``reasoning_effort`` as Chat and Responses carry it: thinking on or off, and a thinking
budget for templates that know no levels (``ninfer_serve.effort`` has the template's side)."""

from __future__ import annotations

from ..effort import THINKING_OFF, Effort

__all__ = ["EFFORT_BUDGETS", "requested_effort", "thinking_for_effort"]

#: ``reasoning_effort`` levels as thinking budgets (tokens of reasoning, ``</think>`` included)
EFFORT_BUDGETS = {"low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768}


def thinking_for_effort(effort: str | None) -> tuple[bool | None, int | None]:
    """(thinking on or off, thinking budget) for a reasoning effort.

    Qwen templates know only thinking on or off, so the levels become budgets
    (``EFFORT_BUDGETS``): ``none``/``minimal`` turn thinking off, absent leaves the defaults.
    A template with effort levels of its own (GLM-5) takes the level instead and the budget
    is dropped when the prompt is rendered (``ninfer_serve.effort``).
    """
    if effort is None:
        return None, None
    if effort in THINKING_OFF:
        return False, None
    return True, EFFORT_BUDGETS[effort]


def requested_effort(
    effort: str | None, param: str, explicit_budget: int | None, budget: int | None
) -> Effort | None:
    """The job's ``reasoning_effort``: whether its budget came from the effort is kept, so a
    template that takes the level itself can drop that budget (never an explicit one)."""
    if effort is None:
        return None
    return Effort(effort, param, sets_budget=explicit_budget is None and budget is not None)
