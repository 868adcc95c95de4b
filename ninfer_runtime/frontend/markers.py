"""The structural tokens of the ChatML / Qwen / GLM vocabularies, as text.

Chat templates write them, the output parsers read them, and the tokenizer looks their ids up;
they live here so none of those has to import another for a string.
"""

from __future__ import annotations

__all__ = [
    "ARG_KEY_CLOSE",
    "ARG_KEY_OPEN",
    "ARG_VALUE_CLOSE",
    "ARG_VALUE_OPEN",
    "ENDOFTEXT",
    "IM_END",
    "IM_START",
    "STRUCTURAL_TOKENS",
    "THINK_CLOSE",
    "THINK_OPEN",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "TOOL_RESPONSE_CLOSE",
    "TOOL_RESPONSE_OPEN",
]

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
#: GLM's argument tags inside ``<tool_call>`` (added tokens of its vocabulary)
ARG_KEY_OPEN = "<arg_key>"
ARG_KEY_CLOSE = "</arg_key>"
ARG_VALUE_OPEN = "<arg_value>"
ARG_VALUE_CLOSE = "</arg_value>"

#: Markers the output parsers read; streaming keeps them even when special tokens are skipped.
STRUCTURAL_TOKENS = (
    THINK_OPEN,
    THINK_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    ARG_KEY_OPEN,
    ARG_KEY_CLOSE,
    ARG_VALUE_OPEN,
    ARG_VALUE_CLOSE,
)
