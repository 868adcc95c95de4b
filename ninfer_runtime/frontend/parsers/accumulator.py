"""Folding parse events into a whole output, as a non-streaming response needs it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ninfer_runtime.frontend.parsers.events import (
    ParseEvent,
    ParseWarning,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from ninfer_runtime.frontend.parsers.output_parser import OutputParser


@dataclass
class ParsedToolCall:
    """A finished call: ``arguments`` is the JSON object text; ``cut_off`` as in ``ToolCallEnd``."""

    index: int
    id: str
    name: str
    arguments: str
    cut_off: bool = False


@dataclass
class ParsedOutput:
    """The whole output, as a non-streaming response needs it."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ParsedToolCall] = field(default_factory=list)
    warnings: list[ParseWarning] = field(default_factory=list)


class OutputAccumulator:
    """Folds events into a ``ParsedOutput``; abandoned calls (warned with an index) are left out."""

    def __init__(self) -> None:
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: dict[int, tuple[str, str, list[str]]] = {}
        self._ended: dict[int, bool] = {}  # index -> cut off
        self._warnings: list[ParseWarning] = []

    def add(self, events: Iterable[ParseEvent]) -> None:
        for event in events:
            if isinstance(event, ReasoningDelta):
                self._reasoning.append(event.text)
            elif isinstance(event, TextDelta):
                self._content.append(event.text)
            elif isinstance(event, ToolCallStart):
                self._calls[event.index] = (event.id, event.name, [])
            elif isinstance(event, ToolCallArgumentsDelta):
                self._calls[event.index][2].append(event.text)
            elif isinstance(event, ToolCallEnd):
                self._ended[event.index] = event.cut_off
            else:
                self._warnings.append(event)

    def result(self) -> ParsedOutput:
        calls = [
            ParsedToolCall(index, call_id, name, "".join(parts), self._ended[index])
            for index, (call_id, name, parts) in sorted(self._calls.items())
            if index in self._ended
        ]
        return ParsedOutput(
            reasoning="".join(self._reasoning),
            content="".join(self._content),
            tool_calls=calls,
            warnings=list(self._warnings),
        )


def parse_output(text: str, **options: Any) -> ParsedOutput:
    """Parse a complete output at once (non-streaming responses); options as ``OutputParser``."""
    parser = OutputParser(**options)
    accumulator = OutputAccumulator()
    accumulator.add(parser.feed(text))
    accumulator.add(parser.finish())
    return accumulator.result()
