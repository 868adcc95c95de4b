"""The tool-call machinery ``OutputParser`` shares between call forms.

A call is read in phases (``_Call.phase`` names the ``_phase_*`` method that reads on); this
module holds the call's state, the JSON form, and what every form needs: consuming raw text,
announcing a call and emitting its arguments (streamed or held), ending it, and settling a call
the output left unfinished, by a verbatim fallback to text or, when a limit cut it, by closing
it. ``QwenXmlCallPhases`` adds the XML form, ``GlmOutputParser`` GLM's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ninfer_runtime.frontend.markers import TOOL_CALL_CLOSE as CALL_CLOSE
from ninfer_runtime.frontend.markers import TOOL_CALL_OPEN as CALL_OPEN
from ninfer_runtime.frontend.parsers.events import (
    ParseEvent,
    ParseWarning,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from ninfer_runtime.frontend.parsers.json_calls import _read_json_call
from ninfer_runtime.frontend.parsers.markers import _held_suffix
from ninfer_runtime.frontend.parsers.parameters import _is_string_schema, convert_parameter

if TYPE_CHECKING:
    from ninfer_runtime.frontend.parsers.output_parser import _Channel


def _json_string_body(text: str) -> str:
    """``text`` escaped for the inside of a JSON string (escaping is per character, so chunks
    escaped separately join to the escape of the whole)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


@dataclass
class _Call:
    """State of the tool call being read."""

    origin: str  # channel to fall back to: "reasoning" or "content"
    before: str = ""  # whitespace held before <tool_call>, restored on a fallback
    opener: str = CALL_OPEN  # marker text that a fallback emits as plain text
    raw: str = CALL_OPEN  # everything consumed since the opener, for the verbatim fallback
    phase: str = "open"
    json_body: str = ""
    index: int | None = None  # set once a call was announced (or, in hold mode, begun)
    announced: bool = False
    name: str = ""
    params: int = 0
    schemas: dict[str, Any] = field(default_factory=dict)
    param: str = ""
    param_schema: Any = None
    value: str = ""
    value_started: bool = False
    streaming_value: bool = False
    held: list[ParseEvent] = field(default_factory=list)


class ToolCallReader:
    """The call-reading half of ``OutputParser``: phases shared by the call forms.

    It works on the parser's state, which ``OutputParser.__init__`` sets up: the unread text
    ``_buf``, the call being read ``_call``, the text channels it falls back to, and the options.
    The end-of-output rules name the XML form's phases (``param_value``, ``after_function``);
    another form names its value phase in ``_VALUE_PHASES``.
    """

    _buf: str
    _call: _Call | None
    _next_index: int
    _stream_calls: bool
    _call_id: Callable[[int], str]
    _schemas: dict[str, dict[str, Any]]
    _cut_off: bool
    _channel: str
    _channels: dict[str, _Channel]

    #: the phases that read a parameter's value (a cut-off string value there keeps its text)
    _VALUE_PHASES: tuple[str, ...] = ("param_value",)

    def _scan_call(self, call: _Call, out: list[ParseEvent], final: bool) -> bool:
        """Call mode: advance one phase; returns False when more text is needed."""
        handler = getattr(self, f"_phase_{call.phase}")
        progressed = handler(call, out)
        if not progressed and final and self._call is call:
            (self._cut_off_call if self._cut_off else self._unclosed)(call, out)
            return True
        return progressed

    def _take(self, call: _Call, count: int) -> str:
        taken = self._buf[:count]
        call.raw += taken
        self._buf = self._buf[count:]
        return taken

    def _skip_space(self, call: _Call) -> None:
        stripped = self._buf.lstrip()
        self._take(call, len(self._buf) - len(stripped))

    def _announce(self, call: _Call, name: str, out: list[ParseEvent]) -> None:
        """The name is complete: the call gets its index (and, streaming, its start event)."""
        call.name = name
        call.params = 0
        call.schemas = self._schemas.get(name, {})
        call.index = self._next_index
        self._next_index += 1
        self._emit(call, ToolCallStart(call.index, self._call_id(call.index), name), out)
        call.announced = self._stream_calls

    def _value_text(self, call: _Call, text: str, out: list[ParseEvent]) -> None:
        if call.streaming_value:
            if text:
                self._emit(call, ToolCallArgumentsDelta(call.index, _json_string_body(text)), out)
        else:
            call.value += text

    def _begin_param(self, call: _Call, name: str) -> None:
        """A parameter's name is read: its schema, and whether its value streams."""
        call.param = name
        call.param_schema = call.schemas.get(name)
        call.value = ""
        call.value_started = False
        call.streaming_value = self._stream_calls and _is_string_schema(call.param_schema)

    def _open_value(self, call: _Call, out: list[ParseEvent]) -> None:
        """A streamed value begins: its key and the opening quote go out now."""
        if call.streaming_value:
            self._emit_argument(call, f'{json.dumps(call.param, ensure_ascii=False)}: "', out)

    def _param_value(self, call: _Call) -> Any:
        """The held value of the parameter just ended, as the JSON value its schema asks for."""
        return convert_parameter(call.value, call.param_schema)

    def _end_param(self, call: _Call, out: list[ParseEvent]) -> None:
        if call.streaming_value:
            self._emit(call, ToolCallArgumentsDelta(call.index, '"'), out)
        else:
            self._emit_argument(
                call,
                f"{json.dumps(call.param, ensure_ascii=False)}: "
                f"{json.dumps(self._param_value(call), ensure_ascii=False)}",
                out,
            )
        call.params += 1

    def _emit_argument(self, call: _Call, text: str, out: list[ParseEvent]) -> None:
        """One ``"key": value`` member, opening the object or separating it from the last."""
        prefix = "{" if call.params == 0 else ", "
        self._emit(call, ToolCallArgumentsDelta(call.index, prefix + text), out)

    def _end_function(self, call: _Call, out: list[ParseEvent], cut_off: bool = False) -> None:
        self._emit(call, ToolCallArgumentsDelta(call.index, "}" if call.params else "{}"), out)
        self._emit(call, ToolCallEnd(call.index, cut_off), out)
        out.extend(call.held)
        call.held = []
        call.announced = False
        call.index = None
        call.opener = call.raw = ""  # a later fallback in this block must not repeat this call

    def _phase_json(self, call: _Call, out: list[ParseEvent]) -> bool:
        found = self._buf.find(CALL_CLOSE)
        if found < 0:
            keep = _held_suffix(self._buf, (CALL_CLOSE,))
            call.json_body += self._take(call, len(self._buf) - keep)
            return False
        call.json_body += self._take(call, found)
        problem, name, arguments = _read_json_call(call.json_body)
        if problem:
            self._fall_back(call, out, problem)
            return True
        self._take(call, len(CALL_CLOSE))
        self._json_call(name, arguments, out)
        self._call = None
        return True

    def _json_call(self, name: str, arguments: Mapping[str, Any], out: list[ParseEvent]) -> None:
        index = self._next_index
        self._next_index += 1
        out.append(ToolCallStart(index, self._call_id(index), name))
        out.append(ToolCallArgumentsDelta(index, json.dumps(arguments, ensure_ascii=False)))
        out.append(ToolCallEnd(index))

    def _emit(self, call: _Call, event: ParseEvent, out: list[ParseEvent]) -> None:
        (out if self._stream_calls else call.held).append(event)

    def _unclosed(self, call: _Call, out: list[ParseEvent]) -> None:
        """End of output inside a call: keep it only if its content is complete."""
        if call.phase == "after_function":
            self._call = None
            return
        if call.phase == "json":
            call.json_body += self._take(call, len(self._buf))
            problem, name, arguments = _read_json_call(call.json_body)
            if not problem:
                self._json_call(name, arguments, out)
                self._call = None
                return
        self._take(call, len(self._buf))
        self._fall_back(call, out, "tool call not closed at end of output")

    def _cut_off_call(self, call: _Call, out: list[ParseEvent]) -> None:
        """A limit ended the output inside a call: close it (see ``finish``), never as text."""
        self._call = None
        rest = self._take(call, len(self._buf))
        if call.phase == "after_function":  # only the close tag was missing
            return
        if call.phase == "json":
            problem, name, arguments = _read_json_call(call.json_body + rest)
            if not problem:
                self._json_call(name, arguments, out)
                return
        if call.index is None:  # the function name was not complete: nothing to keep
            out.append(ParseWarning("tool call cut off before its name was dropped", call.raw))
            return
        if call.phase in self._VALUE_PHASES and _is_string_schema(call.param_schema):
            self._end_param(call, out)
        self._end_function(call, out, cut_off=True)

    def _fall_back(self, call: _Call, out: list[ParseEvent], reason: str) -> None:
        """Give up on this call: its raw text becomes text of the channel it interrupted.

        The opening marker is emitted as text and everything after it is scanned again, so a
        valid call written after a broken one is still found.
        """
        index = call.index if call.announced else None
        if call.index is not None and not call.announced:
            self._next_index -= 1  # held events are dropped; the index was never seen
        out.append(ParseWarning(reason, call.raw, index))
        self._call = None
        self._channel = call.origin
        channel = self._channels[call.origin]
        channel.pending += call.before
        if call.opener:
            channel.write(call.opener, out)
        self._buf = call.raw[len(call.opener) :] + self._buf
