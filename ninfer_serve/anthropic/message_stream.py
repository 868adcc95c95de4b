"""A streamed Anthropic message: parse events as content-block SSE events, between
``message_start`` and ``message_stop``, with pings while nothing else is sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ninfer_runtime.frontend import (
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)

from ..errors import from_exception
from ..generation import Run
from ..http import sse_event
from .message_output import stop_reason, thinking_signature, tool_use_id, usage

__all__ = ["ContentBlocks", "message_events"]

_PING = sse_event("ping", {"type": "ping"})


class ContentBlocks:
    """The content-block lifecycle of a streamed message."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None
        self.text = ""
        self.calls: dict[int, int] = {}  # parser call index -> block index

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        out = []
        if self.kind == "thinking":
            out.append(
                self._delta({"type": "signature_delta", "signature": thinking_signature(self.text)})
            )
        out.append(
            sse_event("content_block_stop", {"type": "content_block_stop", "index": self.index})
        )
        self.kind = None
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse_event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self.index, "delta": delta},
        )

    def _open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.kind = kind
        self.text = ""
        out.append(
            sse_event(
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
        )
        return out

    def feed(self, event: Any) -> list[bytes]:
        if isinstance(event, ReasoningDelta):
            out = (
                []
                if self.kind == "thinking"
                else self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            )
            self.text += event.text
            return [*out, self._delta({"type": "thinking_delta", "thinking": event.text})]
        if isinstance(event, TextDelta):
            out = [] if self.kind == "text" else self._open("text", {"type": "text", "text": ""})
            return [*out, self._delta({"type": "text_delta", "text": event.text})]
        if isinstance(event, ToolCallStart):
            out = self._open(
                "tool_use",
                {"type": "tool_use", "id": tool_use_id(event.id), "name": event.name, "input": {}},
            )
            self.calls[event.index] = self.index
            return out
        if (
            isinstance(event, ToolCallArgumentsDelta)
            and self.calls.get(event.index) == (self.index)
            and self.kind == "tool_use"
        ):
            return [self._delta({"type": "input_json_delta", "partial_json": event.text})]
        if isinstance(event, ToolCallEnd) and self.calls.get(event.index) == self.index:
            return self.close()
        return []


async def message_events(mid: str, model: str, run: Run) -> AsyncIterator[bytes]:
    start = {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage(None, run.prompt_tokens),
    }
    yield sse_event("message_start", {"type": "message_start", "message": start})
    yield _PING
    blocks = ContentBlocks()
    try:
        async for data in run.frames(blocks.feed, _PING):
            yield data
    except Exception as exc:
        _, body = from_exception(exc).anthropic(None)
        yield sse_event("error", body)
        return
    for data in blocks.close():
        yield data
    outcome = run.outcome
    assert outcome is not None
    reason, sequence = stop_reason(outcome)
    yield sse_event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": {"output_tokens": outcome.completion_tokens},
        },
    )
    yield sse_event("message_stop", {"type": "message_stop"})
