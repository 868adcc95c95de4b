"""Incremental parsing of model output into reasoning, text and tool calls.

The detokenized output arrives a few characters at a time. ``OutputParser.feed`` turns each
delta into typed events as soon as their meaning is certain, and ``finish`` settles the rest:

* ``<think>...</think>`` is reasoning (``starts_in_reasoning`` when the prompt already opened it);
* ``<tool_call>...</tool_call>`` holds a call in the Qwen XML form (``<function=NAME>`` with
  ``<parameter=ARG>`` blocks) or as JSON (``{"name": ..., "arguments": {...}}``). Calls written
  inside reasoning are still calls (Qwen3.5 does that; dropping them ends agent loops);
* whatever cannot be read as a call falls back to plain text, verbatim, with a ``ParseWarning``
  naming the reason, so nothing the model wrote is ever lost.

Only a suffix that might still become a marker is held back ("<tool" waits for "_call>"), plus
trailing whitespace (the separators around markers are not content). XML arguments stream as
JSON per parameter, and string parameters stream inside their value; the concatenated
``ToolCallArgumentsDelta`` texts of a finished call are one JSON object.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ninfer_runtime.frontend.tokenizer import THINK_CLOSE, THINK_OPEN
from ninfer_runtime.frontend.tokenizer import TOOL_CALL_CLOSE as CALL_CLOSE
from ninfer_runtime.frontend.tokenizer import TOOL_CALL_OPEN as CALL_OPEN

__all__ = [
    "OutputAccumulator",
    "OutputParser",
    "ParseEvent",
    "ParseWarning",
    "ParsedOutput",
    "ParsedToolCall",
    "ReasoningDelta",
    "TextDelta",
    "ToolCallArgumentsDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "convert_parameter",
    "parse_output",
    "prompt_opens_reasoning",
    "tool_parameter_schemas",
]

FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAM_OPEN = "<parameter="
PARAM_CLOSE = "</parameter>"
#: A parameter value ends at its own close tag, or (leniently) where the function or call ends.
VALUE_ENDS = (PARAM_CLOSE, FUNCTION_CLOSE, CALL_CLOSE)
#: Longest function or parameter name accepted; longer means the model is not writing a header.
MAX_NAME = 256
_NAME = re.compile(r"[^\s<>\"'/=]+")
_INTEGER = re.compile(r"[+-]?\d+")


# -- events -------------------------------------------------------------------------------------


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


def prompt_opens_reasoning(prompt: str) -> bool:
    """Whether the rendered prompt leaves a ``<think>`` open, so the output starts in reasoning.

    This is the ``starts_in_reasoning`` flag for ``OutputParser``: Qwen3.5 templates end the
    generation prompt with ``<think>\n`` when thinking is on and with a closed, empty think block
    when it is off.
    """
    opened = prompt.rfind(THINK_OPEN)
    return opened >= 0 and prompt.find(THINK_CLOSE, opened) < 0


# -- parameter conversion -----------------------------------------------------------------------


def tool_parameter_schemas(
    tools: Sequence[Mapping[str, Any]] | None,
) -> dict[str, dict[str, Any]]:
    """function name -> {parameter name -> JSON schema}, from OpenAI-style or bare tools."""
    schemas: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        if not isinstance(tool, Mapping):
            continue
        fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        name = fn.get("name")
        parameters = fn.get("parameters")
        if not isinstance(name, str):
            continue
        props = parameters.get("properties") if isinstance(parameters, Mapping) else None
        schemas[name] = dict(props) if isinstance(props, Mapping) else {}
    return schemas


def _schema_types(schema: Any) -> list[str]:
    """The JSON types a schema admits, in its own order (``anyOf``/``oneOf`` flattened)."""
    if not isinstance(schema, Mapping):
        return []
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    types: list[str] = []
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or ():
            types += [t for t in _schema_types(option) if t not in types]
    if types:
        return types
    if "properties" in schema:
        return ["object"]
    if "items" in schema:
        return ["array"]
    if isinstance(schema.get("enum"), list):
        names = {bool: "boolean", int: "integer", float: "number", str: "string"}
        return list(dict.fromkeys(names.get(type(v), "string") for v in schema["enum"]))
    return []


def _is_string_schema(schema: Any) -> bool:
    return _schema_types(schema) == ["string"]


_MISSING = object()


def _as_type(value: str, kind: str) -> Any:
    """``value`` read as JSON type ``kind``, or ``_MISSING`` when it is not one."""
    text = value.strip()
    if kind == "integer":
        if _INTEGER.fullmatch(text):
            return int(text)
        number = _as_type(text, "number")
        if isinstance(number, float) and number.is_integer():
            return int(number)
        return _MISSING
    if kind == "number":
        try:
            number = json.loads(text)
        except ValueError:
            return _MISSING
        ok = isinstance(number, int | float) and not isinstance(number, bool)
        return number if ok else _MISSING
    if kind == "boolean":
        lowered = text.lower()
        return {"true": True, "false": False}.get(lowered, _MISSING)
    if kind == "null":
        return None if text.lower() in ("null", "none") else _MISSING
    if kind in ("object", "array"):
        expected = dict if kind == "object" else list
        try:
            parsed = json.loads(text)
        except ValueError:
            try:  # models sometimes write Python literals ({'a': True})
                parsed = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return _MISSING
        return parsed if isinstance(parsed, expected) else _MISSING
    return _MISSING


def convert_parameter(value: str, schema: Any) -> Any:
    """An XML parameter value as the JSON value its schema asks for.

    Without a schema, or when the schema admits strings, the text stays a string: the model wrote
    text, and guessing a type would turn a zip code into a number. Otherwise each admitted type is
    tried in schema order; text that fits none stays a string.
    """
    types = _schema_types(schema)
    if not types or "string" in types:
        if "null" in types and value.strip().lower() == "null":
            return None
        return value
    for kind in types:
        converted = _as_type(value, kind)
        if converted is not _MISSING:
            return converted
    return value


def _json_string_body(text: str) -> str:
    """``text`` escaped for the inside of a JSON string (escaping is per character, so chunks
    escaped separately join to the escape of the whole)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


# -- the parser ---------------------------------------------------------------------------------


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


class OutputParser:
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

    # -- tool calls -----------------------------------------------------------------------------

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

    def _announce(self, call: _Call, name: str, out: list[ParseEvent]) -> None:
        """The name is complete: the call gets its index (and, streaming, its start event)."""
        call.name = name
        call.params = 0
        call.schemas = self._schemas.get(name, {})
        call.index = self._next_index
        self._next_index += 1
        self._emit(call, ToolCallStart(call.index, self._call_id(call.index), name), out)
        call.announced = self._stream_calls

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
        call.param = name
        call.param_schema = call.schemas.get(name)
        call.value = ""
        call.value_started = False
        call.streaming_value = self._stream_calls and _is_string_schema(call.param_schema)
        if call.streaming_value:
            self._emit_argument(call, f'{json.dumps(name, ensure_ascii=False)}: "', out)
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

    def _value_text(self, call: _Call, text: str, out: list[ParseEvent]) -> None:
        if call.streaming_value:
            if text:
                self._emit(call, ToolCallArgumentsDelta(call.index, _json_string_body(text)), out)
        else:
            call.value += text

    def _end_param(self, call: _Call, out: list[ParseEvent]) -> None:
        if call.streaming_value:
            self._emit(call, ToolCallArgumentsDelta(call.index, '"'), out)
        else:
            value = convert_parameter(call.value, call.param_schema)
            self._emit_argument(
                call,
                f"{json.dumps(call.param, ensure_ascii=False)}: "
                f"{json.dumps(value, ensure_ascii=False)}",
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
        if call.phase == "param_value" and _is_string_schema(call.param_schema):
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


def _earliest(text: str, markers: Iterable[str]) -> tuple[int, str | None]:
    """Position and marker of the first marker occurrence in ``text`` (longest on a tie)."""
    best, found = len(text), None
    for marker in markers:
        at = text.find(marker)
        if at >= 0 and (at < best or (at == best and found and len(marker) > len(found))):
            best, found = at, marker
    return (best, found) if found is not None else (0, None)


def _held_suffix(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


def _read_json_call(body: str) -> tuple[str, str, dict[str, Any]]:
    """(problem, name, arguments) of a JSON-form call; ``problem`` is empty when it is valid."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        return f"tool call JSON is invalid ({exc.msg} at {exc.pos})", "", {}
    if not isinstance(value, dict):
        return "tool call JSON is not an object", "", {}
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return "tool call JSON has no function name", "", {}
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return "tool call arguments string is not valid JSON", "", {}
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return "tool call arguments are not a JSON object", "", {}
    return "", name, arguments


# -- assembling ---------------------------------------------------------------------------------


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
