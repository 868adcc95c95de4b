"""Which family's conventions a chat template follows: its tool-call form and effort levels.

The template decides, since it is what teaches the model how to answer: one whose tool
instructions or history use ``<arg_key>``/``<arg_value>`` is GLM's (calls are read by
``GlmOutputParser``), any other is read as Qwen's (``OutputParser``: the XML and JSON forms).
So an artifact's own template, a ``--chat-template`` override and ninfer's built-in templates are
all judged the same way, and nothing depends on the architecture's name.

Thinking off: GLM models were trained to see ``/nothink`` at the end of such user turns as well
as an empty think block; a GLM template without a thinking switch (GLM-5's opens ``<think>``
unconditionally) gets both from ``ChatTemplate.render``.

Reasoning effort: GLM-5 templates take a ``reasoning_effort`` variable with the levels low, high
and max (any other value renders as max, and max is also the default), so those are passed
through; a template without such a variable takes none, and the server turns an effort into a
thinking budget instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ninfer_runtime.frontend.glm_tool_calls import GlmOutputParser
from ninfer_runtime.frontend.markers import ARG_KEY_OPEN, ARG_VALUE_OPEN
from ninfer_runtime.frontend.parsers import OutputParser

__all__ = ["GLM", "GLM_EFFORT_LEVELS", "QWEN", "ChatFormat", "detect_chat_format"]

#: the ``reasoning_effort`` values a GLM-5 template distinguishes, least to most
GLM_EFFORT_LEVELS = ("low", "high", "max")
#: GLM's mark on a user turn that asks for no reasoning
NO_THINK = "/nothink"
#: API effort names that mean a template level of another name
_EFFORT_ALIASES = {"xhigh": "max"}


@dataclass(frozen=True)
class ChatFormat:
    """A template family: ``name`` ("qwen" or "glm"), the ``reasoning_effort`` levels its
    template takes (empty: it takes none), and ``no_think_suffix``, set when the template has
    no thinking switch of its own but the family marks a user turn that wants no reasoning
    (GLM: ``/nothink`` at the end of the turn, the way its models were trained)."""

    name: str
    effort_levels: tuple[str, ...] = ()
    no_think_suffix: str | None = None

    def output_parser(
        self, tools: Sequence[Mapping[str, Any]] | None = None, **options: Any
    ) -> OutputParser:
        """The parser for this family's output; options as ``OutputParser``."""
        parser = GlmOutputParser if self.name == "glm" else OutputParser
        return parser(tools=tools, **options)

    def effort_level(self, effort: str) -> str | None:
        """The template's level for an API effort name (``xhigh`` is the top level, max);
        ``None`` when the template has no such level."""
        level = _EFFORT_ALIASES.get(effort, effort)
        return level if level in self.effort_levels else None


QWEN = ChatFormat("qwen")
GLM = ChatFormat("glm")


def detect_chat_format(source: str) -> ChatFormat:
    """The family of a template, from its text (see the module docstring)."""
    if ARG_KEY_OPEN in source and ARG_VALUE_OPEN in source:
        levels = GLM_EFFORT_LEVELS if "reasoning_effort" in source else ()
        switch = "enable_thinking" in source or NO_THINK in source
        return ChatFormat("glm", levels, None if switch else NO_THINK)
    return QWEN
