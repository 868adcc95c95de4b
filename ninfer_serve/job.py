"""What a generation request asks and how it ended, in no particular API's terms.

The OpenAI Chat, OpenAI Responses and Anthropic Messages handlers each translate their wire
request into a ``Job`` and read an ``Outcome`` back for their final response and usage block.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ninfer_runtime.frontend import ParsedOutput

from .cache_boundaries import Breakpoint
from .effort import Effort
from .structured import AnswerGrammar

__all__ = ["Job", "Outcome", "ToolChoice"]

ToolChoice = Literal["auto", "none", "required"] | str  # a str other than those: a named tool


@dataclass
class Job:
    """One generation request, in no particular API's terms: a conversation in ``messages``
    (rendered with the chat template), or a raw ``prompt`` text or ``prompt_ids`` (taken as
    they are, ``messages`` then empty)."""

    messages: list[dict[str, Any]]
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    #: off: the output is plain text (no reasoning or tool-call parsing), as raw completions are
    parse_output: bool = True
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    #: ``None`` (free text), ``{}`` (any JSON object) or a JSON schema
    json_schema: Mapping[str, Any] | None = None
    json_schema_param: str = "response_format"
    #: a regex, choice or grammar the whole answer follows (at most one of it and json_schema)
    answer_grammar: AnswerGrammar | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    enable_thinking: bool | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None
    #: the effort level asked for; a template with levels of its own takes it (``effort``)
    reasoning_effort: Effort | None = None
    continue_final_message: bool = False
    #: off: the prompt ends after the last message, without the assistant turn's opening
    add_generation_prompt: bool = True
    #: text the reply starts with, before anything generated (vLLM's chat ``echo``)
    echo: str = ""
    #: the request field the conversation comes from (an over-long prompt's error names it)
    prompt_param: str = "messages"
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: the prefix-cache namespace (``cache_isolation.cache_salt``); ``cache_shared`` off: no
    #: other request can read this one's entries, so it keeps no checkpoints at its seams
    cache_salt: str | None = None
    cache_shared: bool = True
    #: places the client marked for the prefix cache: in the conversation, or (a raw
    #: prompt) as token counts
    cache_breakpoints: list[Breakpoint] = field(default_factory=list)
    token_breakpoints: list[int] = field(default_factory=list)


@dataclass
class Outcome:
    """How a generation ended, with everything a final response or usage block needs."""

    finish_reason: Literal["stop", "length", "tool_calls", "cancelled"]
    stop_value: int | str | None
    stop_kind: str | None
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    #: speculative decoding: drafted tokens verification kept / turned down (0 without it)
    accepted_draft_tokens: int
    rejected_draft_tokens: int
    prompt_seconds: float
    decode_seconds: float
    context_exhausted: bool
    output: ParsedOutput

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def timings(self) -> dict[str, Any]:
        """llama.cpp's ``timings`` block (tools that read llama-server responses use it)."""
        predicted = max(self.completion_tokens - 1, 0)
        return {
            "cache_n": self.cached_tokens,
            "prompt_n": self.prompt_tokens - self.cached_tokens,
            "prompt_ms": round(self.prompt_seconds * 1000, 3),
            "predicted_n": self.completion_tokens,
            "predicted_ms": round(self.decode_seconds * 1000, 3),
            "predicted_per_second": (
                round(predicted / self.decode_seconds, 3) if self.decode_seconds > 0 else None
            ),
        }
