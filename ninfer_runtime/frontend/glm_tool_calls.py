"""Reading GLM's tool calls out of the output text.

GLM (4.5 and later, GLM-5 included) writes a call as the function name right after
``<tool_call>``, then one ``<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>`` pair per
argument, then ``</tool_call>``: ``<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris
</arg_value></tool_call>``. Whitespace or a newline may sit after the name and between the tags;
a call may have no arguments. Its templates write a string argument as its text and any other
value as JSON, so a value is read back by the tool's parameter schema when there is one, and
otherwise as JSON when it parses, else as the text it is.

``GlmOutputParser`` is ``OutputParser`` with this form added: reasoning, text, the streaming and
fallback rules and the events are the same, and a call in the Qwen XML or JSON form is still
read. A forced ``tool_choice`` grammar for a GLM template writes this form, a value as text
exactly where ``glm_value_is_text`` says the parser keeps it so.
"""

from __future__ import annotations

import json
from typing import Any

from ninfer_runtime.frontend.markers import (
    ARG_KEY_CLOSE,
    ARG_KEY_OPEN,
    ARG_VALUE_CLOSE,
    ARG_VALUE_OPEN,
)
from ninfer_runtime.frontend.markers import TOOL_CALL_CLOSE as CALL_CLOSE
from ninfer_runtime.frontend.parsers.call_reader import _Call
from ninfer_runtime.frontend.parsers.events import ParseEvent
from ninfer_runtime.frontend.parsers.markers import _earliest, _held_suffix
from ninfer_runtime.frontend.parsers.output_parser import OutputParser
from ninfer_runtime.frontend.parsers.parameters import (
    _schema_types,
    convert_parameter,
)
from ninfer_runtime.frontend.parsers.qwen_xml_calls import MAX_NAME

__all__ = [
    "GlmOutputParser",
    "convert_glm_value",
    "glm_value_is_text",
]

#: a value ends at its close tag, or (leniently) where the call ends
_VALUE_ENDS = (ARG_VALUE_CLOSE, CALL_CLOSE)
#: what may follow a call's name or an argument: another argument or the end of the call
_BODY_MARKERS = (ARG_KEY_OPEN, CALL_CLOSE)


def convert_glm_value(value: str, schema: Any) -> Any:
    """An ``<arg_value>`` text as a JSON value: typed by ``schema`` when it names a type, else
    parsed as JSON (GLM's templates write non-string values as JSON), else kept as text."""
    if _schema_types(schema):
        return convert_parameter(value, schema)
    try:
        return json.loads(value)
    except ValueError:
        return value


def glm_value_is_text(schema: Any) -> bool:
    """Whether ``convert_glm_value`` keeps a value of ``schema`` as the text written (the
    schema names a type and admits strings); any other value is read as JSON of its types."""
    types = _schema_types(schema)
    return bool(types) and "string" in types


class GlmOutputParser(OutputParser):
    """``OutputParser`` that also reads GLM's ``<arg_key>``/``<arg_value>`` calls."""

    _VALUE_PHASES = (*OutputParser._VALUE_PHASES, "glm_value")

    def _phase_open(self, call: _Call, out: list[ParseEvent]) -> bool:
        self._skip_space(call)
        buf = self._buf
        if not buf or buf[0] in "{<":  # JSON, the Qwen XML header, or an empty call
            return super()._phase_open(call, out)
        call.phase = "glm_name"
        return True

    def _phase_glm_name(self, call: _Call, out: list[ParseEvent]) -> bool:
        """The function name runs to the first ``<`` or line break."""
        end = min((i for i in (self._buf.find("<"), self._buf.find("\n")) if i >= 0), default=-1)
        if end < 0:
            if len(self._buf) > MAX_NAME:
                self._fall_back(call, out, "tool call name is not followed by <arg_key>")
                return True
            return False
        name = self._buf[:end].strip()
        if not name or len(name) > MAX_NAME or any(c.isspace() or c in "\"'/=>" for c in name):
            self._fall_back(call, out, f"invalid function name {self._buf[:end]!r}")
            return True
        self._take(call, end)
        self._announce(call, name, out)
        call.phase = "glm_body"
        return True

    def _phase_glm_body(self, call: _Call, out: list[ParseEvent]) -> bool:
        self._skip_space(call)
        buf = self._buf
        if buf.startswith(ARG_KEY_OPEN):
            self._take(call, len(ARG_KEY_OPEN))
            call.phase = "glm_key"
            return True
        if buf.startswith(CALL_CLOSE):
            self._take(call, len(CALL_CLOSE))
            self._end_function(call, out)
            self._call = None
            return True
        if not buf or any(m.startswith(buf) for m in _BODY_MARKERS):
            return False
        self._fall_back(call, out, f"unexpected text inside the call of {call.name}")
        return True

    def _phase_glm_key(self, call: _Call, out: list[ParseEvent]) -> bool:
        end = self._buf.find(ARG_KEY_CLOSE)
        if end < 0:
            if len(self._buf) > MAX_NAME + len(ARG_KEY_CLOSE):
                self._fall_back(call, out, "<arg_key> is not closed by </arg_key>")
                return True
            return False
        key = self._buf[:end].strip()
        if not key or len(key) > MAX_NAME or "<" in key:
            self._fall_back(call, out, f"invalid argument name {self._buf[:end]!r}")
            return True
        self._take(call, end + len(ARG_KEY_CLOSE))
        self._begin_param(call, key)
        call.phase = "glm_value_open"
        return True

    def _phase_glm_value_open(self, call: _Call, out: list[ParseEvent]) -> bool:
        self._skip_space(call)
        if self._buf.startswith(ARG_VALUE_OPEN):
            self._take(call, len(ARG_VALUE_OPEN))
            self._open_value(call, out)
            call.phase = "glm_value"
            return True
        if not self._buf or ARG_VALUE_OPEN.startswith(self._buf):
            return False
        self._fall_back(call, out, f"argument {call.param!r} has no <arg_value>")
        return True

    def _phase_glm_value(self, call: _Call, out: list[ParseEvent]) -> bool:
        found, marker = _earliest(self._buf, _VALUE_ENDS)
        if marker is None:  # stream what cannot be the start of an end tag
            ready = len(self._buf) - _held_suffix(self._buf, _VALUE_ENDS)
            if ready > 0:
                self._value_text(call, self._take(call, ready), out)
            return False
        self._value_text(call, self._take(call, found), out)
        self._end_param(call, out)
        if marker == ARG_VALUE_CLOSE:
            self._take(call, len(ARG_VALUE_CLOSE))
            call.phase = "glm_body"
        else:  # </arg_value> forgotten: the call still ends here
            self._take(call, len(CALL_CLOSE))
            self._end_function(call, out)
            self._call = None
        return True

    def _param_value(self, call: _Call) -> Any:
        if call.phase == "glm_value":
            return convert_glm_value(call.value, call.param_schema)
        return super()._param_value(call)
