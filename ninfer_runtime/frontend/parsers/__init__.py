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

One module per job: ``events`` (what the parser emits), ``output_parser`` (text and reasoning,
and the driver), ``call_reader`` (call state and what every call form shares, the JSON form
included), ``qwen_xml_calls`` (the ``<function=NAME>`` form), ``parameters`` (schemas and the
typing of XML argument values), ``markers`` and ``json_calls`` (their helpers) and
``accumulator`` (events -> a whole ``ParsedOutput``). GLM's call form builds on these in
``frontend.glm_tool_calls``.
"""

from ninfer_runtime.frontend.parsers.accumulator import (
    OutputAccumulator,
    ParsedOutput,
    ParsedToolCall,
    parse_output,
)
from ninfer_runtime.frontend.parsers.events import (
    ParseEvent,
    ParseWarning,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from ninfer_runtime.frontend.parsers.output_parser import OutputParser, prompt_opens_reasoning
from ninfer_runtime.frontend.parsers.parameters import convert_parameter, tool_parameter_schemas

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
