"""The events ``OutputParser`` turns model output into.

A stream of them says everything the output holds: reasoning and visible text as deltas, each
tool call as a start, JSON argument deltas and an end, and a ``ParseWarning`` wherever text was
not read as intended (it is also emitted as text, so nothing is lost).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningDelta:
    """More reasoning text (inside ``<think>``)."""

    text: str


@dataclass(frozen=True)
class TextDelta:
    """More visible answer text."""

    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """A tool call began; ``index`` counts calls in this output from 0."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgumentsDelta:
    """More of the call's JSON arguments; all deltas of a finished call join to one object."""

    index: int
    text: str


@dataclass(frozen=True)
class ToolCallEnd:
    """The call ended and its arguments are valid JSON.

    ``cut_off``: a limit ended the output inside the call, so arguments may be missing or a
    string value may stop short (``OutputParser.finish``).
    """

    index: int
    cut_off: bool = False


@dataclass(frozen=True)
class ParseWarning:
    """Something was not read as intended and fell back to text.

    ``text`` is the raw text concerned (it was also emitted as text). ``index`` is set when a
    call had already been announced by ``ToolCallStart``: that call is abandoned and will get no
    ``ToolCallEnd``, so a consumer should discard it.
    """

    reason: str
    text: str = ""
    index: int | None = None


ParseEvent = (
    ReasoningDelta | TextDelta | ToolCallStart | ToolCallArgumentsDelta | ToolCallEnd | ParseWarning
)
