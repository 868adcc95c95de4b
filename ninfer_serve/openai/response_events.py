"""Parse events folded into Responses output items and, when streaming, the semantic SSE
events (``response.output_item.added``, ``response.output_text.delta``, ...) with a monotonic
``sequence_number``.

With log-probabilities asked for, an ``output_text`` part lists those of its tokens: the ones
generated since the previous output event (reasoning and tool-call tokens belong to their items,
which have no such field), and a ``response.output_text.delta`` event those of its delta.
"""

from __future__ import annotations

from typing import Any

from ninfer_runtime.engine import TokenEvent
from ninfer_runtime.frontend import (
    ParseEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)

from ..http import new_id, sse_event
from .logprobs import scored, text_logprobs

__all__ = ["ResponseBuilder"]


class ResponseBuilder:
    """Folds parse events into output items, and (streaming) into semantic SSE events.

    With ``tokens`` (the run's generated tokens, a list that grows as they come) and a
    ``tokenizer``, each text delta carries the log-probabilities of the tokens that came
    since the previous event, less any up to the end of the reasoning (``</think>``, which no
    reasoning event shows when it is the last of its tokens).
    """

    def __init__(
        self,
        skeleton: dict[str, Any],
        tokens: list[TokenEvent] | None = None,
        tokenizer: Any | None = None,
    ):
        self.skeleton = skeleton
        self.output: list[dict[str, Any]] = []
        self.sequence = 0
        self._open: dict[str, Any] | None = None  # the item receiving deltas
        self._calls: dict[int, dict[str, Any]] = {}
        self._tokens = tokens if tokenizer is not None else None
        self._tokenizer = tokenizer
        close = tokenizer.think_close_ids if tokenizer is not None else ()
        self._reasoning_end = close[-1] if close else None
        self._taken = 0  # tokens already given to an event

    def _take_tokens(self) -> list[TokenEvent]:
        """The answer tokens no event has taken yet (none when not asked for)."""
        if self._tokens is None:
            return []
        fresh = self._tokens[self._taken :]
        self._taken += len(fresh)
        ends = [i for i, t in enumerate(fresh) if t.token_id == self._reasoning_end]
        return fresh[ends[-1] + 1 :] if ends else fresh

    def _logprobs(self, tokens: list[TokenEvent]) -> list[dict[str, Any]]:
        return text_logprobs(self._tokenizer, scored(tokens)) if tokens else []

    def event(self, kind: str, /, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse_event(kind, payload)

    def response(self, **changes: Any) -> dict[str, Any]:
        return {**self.skeleton, "output": list(self.output), **changes}

    def _close_open(self) -> list[bytes]:
        item, self._open = self._open, None
        if item is None or item["type"] == "function_call":
            return []
        index = self.output.index(item)
        part = item["content"][0]
        kind = "reasoning_text" if item["type"] == "reasoning" else "output_text"
        item["status"] = "completed"
        extra = {"logprobs": part["logprobs"]} if kind == "output_text" else {}
        return [
            self.event(
                f"response.{kind}.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                **extra,
            ),
            self.event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def _start(self, item: dict[str, Any], part: dict[str, Any] | None) -> list[bytes]:
        out = self._close_open()
        self.output.append(item)
        index = len(self.output) - 1
        shown = {**item, "content": []} if part is not None else item
        out.append(self.event("response.output_item.added", output_index=index, item=shown))
        if part is not None:
            item["content"] = [part]
            out.append(
                self.event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part={**part},
                )
            )
        self._open = item
        return out

    def feed(self, event: ParseEvent) -> list[bytes]:
        tokens = self._take_tokens()  # a text delta shows them; other items have no place
        if isinstance(event, ReasoningDelta | TextDelta):
            reasoning = isinstance(event, ReasoningDelta)
            kind = "reasoning" if reasoning else "message"
            out: list[bytes] = []
            if self._open is None or self._open["type"] != kind:
                if reasoning:
                    item = {
                        "type": "reasoning",
                        "id": new_id("rs_"),
                        "summary": [],
                        "status": "in_progress",
                    }
                    part = {"type": "reasoning_text", "text": ""}
                else:
                    item = {
                        "type": "message",
                        "id": new_id("msg_"),
                        "status": "in_progress",
                        "role": "assistant",
                    }
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                out = self._start(item, part)
            item = self._open
            assert item is not None
            item["content"][0]["text"] += event.text
            name = "response.reasoning_text.delta" if reasoning else "response.output_text.delta"
            extra = {}
            if not reasoning:
                extra["logprobs"] = logprobs = self._logprobs(tokens)
                item["content"][0]["logprobs"] += logprobs
            out.append(
                self.event(
                    name,
                    item_id=item["id"],
                    output_index=len(self.output) - 1,
                    content_index=0,
                    delta=event.text,
                    **extra,
                )
            )
            return out
        if isinstance(event, ToolCallStart):
            item = {
                "type": "function_call",
                "id": new_id("fc_"),
                "call_id": event.id,
                "name": event.name,
                "arguments": "",
                "status": "in_progress",
            }
            self._calls[event.index] = item
            return self._start(item, None)
        if isinstance(event, ToolCallArgumentsDelta) and event.index in self._calls:
            item = self._calls[event.index]
            item["arguments"] += event.text
            return [
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self.output.index(item),
                    delta=event.text,
                )
            ]
        if isinstance(event, ToolCallEnd) and event.index in self._calls:
            item = self._calls[event.index]
            item["status"] = "incomplete" if event.cut_off else "completed"
            index = self.output.index(item)
            if self._open is item:
                self._open = None
            return [
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                ),
                self.event("response.output_item.done", output_index=index, item=item),
            ]
        return []

    def finish(self) -> list[bytes]:
        # tokens whose text never came out (a stop string, say) belong to the open text
        tokens = self._take_tokens()
        if self._open is not None and self._open["type"] == "message":
            self._open["content"][0]["logprobs"] += self._logprobs(tokens)
        out = self._close_open()
        # a call that never ended (abandoned by the parser) is not part of the answer
        self.output[:] = [i for i in self.output if i["status"] != "in_progress"]
        return out
