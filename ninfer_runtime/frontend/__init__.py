"""The engine's frontend: what turns a chat request into token ids and token ids into a reply.

One module per job: ``tokenizer`` (ids <-> text, special ids, EOS, model sampling defaults,
streaming detokenization), ``chat_template`` (messages -> prompt), ``parsers`` (output text ->
reasoning / text / tool-call events), ``sampling`` (parameters and the numpy sampler) and
``stops`` (EOS, stop ids, stop strings). Per generated token the engine runs
``StopMatcher.check_token`` -> ``DetokenizeStream.add`` -> ``StopMatcher.feed`` ->
``OutputParser.feed``.
"""

from ninfer_runtime.frontend.chat_template import ChatTemplate, normalize_messages, normalize_tools
from ninfer_runtime.frontend.parsers import (
    OutputAccumulator,
    OutputParser,
    ParsedOutput,
    ParsedToolCall,
    ParseEvent,
    ParseWarning,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
    parse_output,
)
from ninfer_runtime.frontend.sampling import Sampler, SamplingParams, sample_lanes
from ninfer_runtime.frontend.stops import StopMatcher, StopReason, StopStep
from ninfer_runtime.frontend.tokenizer import DetokenizeStream, SpecialTokens, Tokenizer

__all__ = [
    "ChatTemplate",
    "DetokenizeStream",
    "OutputAccumulator",
    "OutputParser",
    "ParseEvent",
    "ParseWarning",
    "ParsedOutput",
    "ParsedToolCall",
    "ReasoningDelta",
    "Sampler",
    "SamplingParams",
    "SpecialTokens",
    "StopMatcher",
    "StopReason",
    "StopStep",
    "TextDelta",
    "Tokenizer",
    "ToolCallArgumentsDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "normalize_messages",
    "normalize_tools",
    "parse_output",
    "sample_lanes",
]
