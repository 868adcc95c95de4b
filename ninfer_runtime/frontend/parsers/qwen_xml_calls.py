"""Reading the Qwen XML call form: ``<function=NAME>`` with ``<parameter=ARG>`` blocks.

``<tool_call>`` opens either this form or a JSON object (``_phase_open`` tells them apart);
several functions may share one block, and a forgotten ``</function>`` or ``</tool_call>`` is
forgiven. String parameters stream inside their JSON value; others are converted by the tool's
schema once complete (``convert_parameter``).
"""

from __future__ import annotations

import re

from ninfer_runtime.frontend.markers import TOOL_CALL_CLOSE as CALL_CLOSE
from ninfer_runtime.frontend.parsers.call_reader import ToolCallReader, _Call
from ninfer_runtime.frontend.parsers.events import ParseEvent
from ninfer_runtime.frontend.parsers.markers import _earliest, _held_suffix

FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAM_OPEN = "<parameter="
PARAM_CLOSE = "</parameter>"
#: A parameter value ends at its own close tag, or (leniently) where the function or call ends.
VALUE_ENDS = (PARAM_CLOSE, FUNCTION_CLOSE, CALL_CLOSE)
#: Longest function or parameter name accepted; longer means the model is not writing a header.
MAX_NAME = 256
_NAME = re.compile(r"[^\s<>\"'/=]+")


class QwenXmlCallPhases(ToolCallReader):
    """``ToolCallReader`` with the phases of the XML form (and the choice of form)."""

    def _phase_open(self, call: _Call, out: list[ParseEvent]) -> bool:
        self._skip_space(call)
        buf = self._buf
        if not buf:
            return False
        if buf[0] == "{":
            call.phase = "json"
            return True
        if buf.startswith(FUNCTION_OPEN):
            self._take(call, len(FUNCTION_OPEN))
            call.phase = "function_name"
            return True
        if FUNCTION_OPEN.startswith(buf):
            return False
        reason = (
            "empty tool call"
            if buf.startswith(CALL_CLOSE)
            else ("tool call has neither a <function=NAME> header nor a JSON object")
        )
        self._fall_back(call, out, reason)
        return True

    def _read_name(self, call: _Call, out: list[ParseEvent], what: str) -> str | None:
        """A ``NAME>`` header; ``None`` while incomplete (or after a fallback)."""
        end = self._buf.find(">")
        if end < 0:
            if len(self._buf) > MAX_NAME or any(c in self._buf for c in "\n<"):
                self._fall_back(call, out, f"{what} name is not closed by '>'")
            return None
        name = self._buf[:end].strip()
        if not _NAME.fullmatch(name) or len(name) > MAX_NAME:
            self._fall_back(call, out, f"invalid {what} name {self._buf[:end]!r}")
            return None
        self._take(call, end + 1)
        return name

    def _phase_function_name(self, call: _Call, out: list[ParseEvent]) -> bool:
        name = self._read_name(call, out, "function")
        if name is None:
            return self._call is not call  # a fallback is progress
        self._announce(call, name, out)
        call.phase = "function_body"
        return True

    def _phase_function_body(self, call: _Call, out: list[ParseEvent]) -> bool:
        self._skip_space(call)
        buf = self._buf
        if buf.startswith(PARAM_OPEN):
            self._take(call, len(PARAM_OPEN))
            call.phase = "param_name"
            return True
        if buf.startswith(FUNCTION_CLOSE):
            self._take(call, len(FUNCTION_CLOSE))
            self._end_function(call, out)
            call.phase = "after_function"
            return True
        if buf.startswith(CALL_CLOSE):  # </function> forgotten: the call is still complete
            self._take(call, len(CALL_CLOSE))
            self._end_function(call, out)
            self._call = None
            return True
        if not buf or any(m.startswith(buf) for m in (PARAM_OPEN, FUNCTION_CLOSE, CALL_CLOSE)):
            return False
        self._fall_back(call, out, f"unexpected text inside <function={call.name}>")
        return True

    def _phase_param_name(self, call: _Call, out: list[ParseEvent]) -> bool:
        name = self._read_name(call, out, "parameter")
        if name is None:
            return self._call is not call
        self._begin_param(call, name)
        self._open_value(call, out)
        call.phase = "param_value"
        return True

    def _phase_param_value(self, call: _Call, out: list[ParseEvent]) -> bool:
        if not call.value_started:
            if not self._buf:
                return False
            if self._buf[0] == "\n":  # the newline after <parameter=NAME> is layout
                self._take(call, 1)
            call.value_started = True
        found, marker = _earliest(self._buf, VALUE_ENDS)
        if marker is None:
            cut = len(self._buf) - _held_suffix(self._buf, VALUE_ENDS)
            if self._buf[:cut].endswith("\n"):  # might be the layout newline before the end
                cut -= 1
            if cut > 0:
                self._value_text(call, self._take(call, cut), out)
            return False
        text = self._take(call, found)
        if text.endswith("\n"):
            text = text[:-1]
        self._value_text(call, text, out)
        if marker == PARAM_CLOSE:
            self._take(call, len(PARAM_CLOSE))
        self._end_param(call, out)
        call.phase = "function_body"
        return True

    def _phase_after_function(self, call: _Call, out: list[ParseEvent]) -> bool:
        self._skip_space(call)
        buf = self._buf
        if buf.startswith(CALL_CLOSE):
            self._take(call, len(CALL_CLOSE))
            self._call = None
            return True
        if buf.startswith(FUNCTION_OPEN):  # several functions in one <tool_call> block
            self._take(call, len(FUNCTION_OPEN))
            call.phase = "function_name"
            return True
        if not buf or CALL_CLOSE.startswith(buf) or FUNCTION_OPEN.startswith(buf):
            return False
        self._call = None  # </tool_call> forgotten; what follows is text again
        return True
