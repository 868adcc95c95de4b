"""The engine's frontend: what turns a chat request into token ids and token ids into a reply.

One module per job: ``tokenizer`` (ids <-> text, special ids, EOS), ``markers`` (the
structural token strings), ``byte_level`` (the byte-level BPE alphabet), ``generation_defaults``
(the model's sampling defaults), ``detokenize`` (streaming detokenization), ``chat_template``
(messages -> prompt) with ``chat_messages`` (request checking) and ``template_environment`` (the
Jinja setup), ``parsers`` (output text -> reasoning / text / tool-call events),
``sampling_params`` (the request's sampling fields), ``sampling`` (the numpy sampler) and
``stops`` (EOS, stop ids, stop strings). Per generated token the engine runs
``StopMatcher.check_token`` -> ``DetokenizeStream.add`` -> ``StopMatcher.feed`` ->
``OutputParser.feed``.
"""

from ninfer_runtime.frontend.chat_messages import normalize_messages, normalize_tools
from ninfer_runtime.frontend.chat_template import ChatTemplate
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
from ninfer_runtime.frontend.sampling import Sampler, sample_lanes
from ninfer_runtime.frontend.sampling_params import SamplingParams
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
