"""``OutputParser``: model output, a delta at a time, as reasoning, text and tool-call events.

Text mode writes to the reasoning or content channel up to the next marker (``<think>``,
``</think>``, ``<tool_call>``); a call opener hands over to the call phases
(``QwenXmlCallPhases`` and the ``ToolCallReader`` they build on) until the call ends or falls
back to text.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ninfer_runtime.frontend.markers import THINK_CLOSE, THINK_OPEN
from ninfer_runtime.frontend.markers import TOOL_CALL_OPEN as CALL_OPEN
from ninfer_runtime.frontend.parsers.call_reader import _Call
from ninfer_runtime.frontend.parsers.events import (
    ParseEvent,
    ParseWarning,
    ReasoningDelta,
    TextDelta,
)
from ninfer_runtime.frontend.parsers.markers import _earliest, _held_suffix
from ninfer_runtime.frontend.parsers.parameters import tool_parameter_schemas
from ninfer_runtime.frontend.parsers.qwen_xml_calls import QwenXmlCallPhases


def prompt_opens_reasoning(prompt: str) -> bool:
    """Whether the rendered prompt leaves a ``<think>`` open, so the output starts in reasoning.

    This is the ``starts_in_reasoning`` flag for ``OutputParser``: Qwen3.5 templates end the
    generation prompt with ``<think>\n`` when thinking is on and with a closed, empty think block
    when it is off.
    """
    opened = prompt.rfind(THINK_OPEN)
    return opened >= 0 and prompt.find(THINK_CLOSE, opened) < 0


class _Channel:
    """One text stream (reasoning or content) with the whitespace policy around markers.

    Leading whitespace of the first text is dropped, and trailing whitespace is held until more
    text follows, so separators the model writes around ``</think>`` and tool calls do not end up
    in the visible text (and re-rendered history matches what the model wrote).
    """

    def __init__(self, make: Callable[[str], ParseEvent]) -> None:
        self.make = make
        self.started = False
        self.pending = ""

    def write(self, text: str, out: list[ParseEvent]) -> None:
        if not self.started:
            text = text.lstrip()
            if not text:
                return
            self.started = True
        body = text.rstrip()
        if not body:
            self.pending += text
            return
        out.append(self.make(self.pending + body))
        self.pending = text[len(body) :]

    def drop_pending(self) -> None:
        self.pending = ""


class OutputParser(QwenXmlCallPhases):
    """Feed text deltas, get events; call ``finish`` once at the end of the output.

    ``tools`` (OpenAI-style) gives the parameter schemas that type XML argument values.
    ``stream_tool_calls=False`` holds each call until it is complete, so a call that breaks
    never shows up as an announced call (the verbatim-fallback policy); by default calls stream.
    ``call_id`` makes the ids of calls (default: random ``call_...``). ``continues_text``: the
    output continues text already written (an assistant message left open), so its leading
    whitespace is part of that text and kept, not dropped as a separator.
    """

    def __init__(
        self,
        *,
        starts_in_reasoning: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        parse_reasoning: bool = True,
        parse_tool_calls: bool = True,
        stream_tool_calls: bool = True,
        call_id: Callable[[int], str] | None = None,
        continues_text: bool = False,
    ) -> None:
        self._parse_reasoning = parse_reasoning
        self._parse_calls = parse_tool_calls
        self._stream_calls = stream_tool_calls
        self._call_id = call_id or (lambda _index: f"call_{uuid.uuid4().hex[:24]}")
        self._schemas = tool_parameter_schemas(tools)
        self._channels = {
            "reasoning": _Channel(ReasoningDelta),
            "content": _Channel(TextDelta),
        }
        self._channel = "reasoning" if (starts_in_reasoning and parse_reasoning) else "content"
        self._channels[self._channel].started = continues_text
        self._buf = ""
        self._call: _Call | None = None
        self._next_index = 0
        self._finished = False
        self._cut_off = False

    # -- public ---------------------------------------------------------------------------------

    def feed(self, delta: str) -> list[ParseEvent]:
        """Consume one text delta; returns the events it made certain."""
        if self._finished:
            raise RuntimeError("OutputParser.feed after finish")
        self._buf += delta
        out: list[ParseEvent] = []
        self._run(out, final=False)
        return out

    def finish(self, *, cut_off: bool = False) -> list[ParseEvent]:
        """End of output: settle held text and any unclosed call.

        ``cut_off`` says a limit ended the output (``max_tokens``, the context, a stop string or
        stop token the client set), not the model. Then an unfinished call is closed instead of
        falling back to text, so no markup reaches the reply: a call whose function name was
        complete ends with the arguments written so far (an unfinished string value keeps its
        text; an unfinished value of another type is left out), an earlier one is dropped with
        a ``ParseWarning``. A suffix held because it might have become a marker is dropped too.
        """
        if self._finished:
            return []
        self._finished = True
        self._cut_off = cut_off
        out: list[ParseEvent] = []
        self._run(out, final=True)
        for channel in self._channels.values():
            channel.drop_pending()
        return out

    @property
    def in_reasoning(self) -> bool:
        """Whether the output is currently inside reasoning (for reasoning budgets)."""
        return self._channel == "reasoning"

    # -- driver ---------------------------------------------------------------------------------

    def _run(self, out: list[ParseEvent], *, final: bool) -> None:
        while True:
            if self._call is None:
                progressed = self._scan_text(out, final)
            else:
                progressed = self._scan_call(self._call, out, final)
            if not progressed:
                return

    def _text_markers(self) -> tuple[str, ...]:
        markers: list[str] = []
        if self._parse_reasoning:
            markers += [THINK_OPEN, THINK_CLOSE]
        if self._parse_calls:
            markers.append(CALL_OPEN)
        return tuple(markers)

    def _scan_text(self, out: list[ParseEvent], final: bool) -> bool:
        """Text mode: emit up to the next marker; returns True when a marker switched state."""
        markers = self._text_markers()
        found, marker = _earliest(self._buf, markers)
        channel = self._channels[self._channel]
        if marker is None:
            keep = 0 if final and not self._cut_off else _held_suffix(self._buf, markers)
            ready = self._buf[: len(self._buf) - keep]
            self._buf = self._buf[len(ready) :]
            if ready:
                channel.write(ready, out)
            return False
        if found:
            channel.write(self._buf[:found], out)
        self._buf = self._buf[found + len(marker) :]
        if marker == CALL_OPEN:
            self._call = _Call(origin=self._channel, before=channel.pending)
            channel.drop_pending()
        elif marker == THINK_OPEN:
            if self._channel == "content":
                channel.drop_pending()
                self._channel = "reasoning"
            # a repeated <think> inside reasoning carries nothing
        elif self._channel == "reasoning":  # </think>
            channel.drop_pending()
            self._channel = "content"
        else:
            out.append(ParseWarning("stray </think> outside reasoning was dropped", THINK_CLOSE))
        return True
