"""The streamed reply of Chat Completions: one SSE chunk per parse event of each choice
(its ``delta``), the choices interleaved as they come, then each choice's finish."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ninfer_runtime.frontend import (
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

from ..http import KEEPALIVE, sse_data
from ..samples import SampleEvent, Samples, combined
from .chat_output import usage_block
from .chunk_stream import DONE, StreamUsage, failed_stream_end
from .finish_reasons import chat_finish_reason, stop_reason
from .logprobs import chat_logprobs, scored
from .models import StreamOptions

__all__ = ["chat_chunks"]


def _delta(event: Any) -> dict[str, Any] | None:
    """A streamed chunk's ``delta`` for a parse event (None: the event shows nothing)."""
    if isinstance(event, TextDelta):
        return {"content": event.text}
    if isinstance(event, ReasoningDelta):
        return {"reasoning_content": event.text}
    if isinstance(event, ToolCallStart):
        call = {
            "index": event.index,
            "id": event.id,
            "type": "function",
            "function": {"name": event.name, "arguments": ""},
        }
        return {"tool_calls": [call]}
    if isinstance(event, ToolCallArgumentsDelta):
        return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}
    return None


async def chat_chunks(
    cid: str,
    model: str,
    samples: Samples,
    options: StreamOptions | None,
    tokenizer: Any | None,
) -> AsyncIterator[bytes]:
    """The SSE stream; ``tokenizer`` given: each chunk carries its choice's new tokens'
    log-probabilities (those generated since the choice's previous chunk). With
    ``continuous_usage_stats`` each chunk carries its choice's token counts so far."""
    usage = StreamUsage.asked(options)
    runs = samples.runs
    created = runs[0].created
    base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
    sent = [0] * len(runs)

    def chunk(item: SampleEvent | int, delta: dict[str, Any], **extra: Any) -> bytes:
        index = item if isinstance(item, int) else item.index
        logprobs = None
        if tokenizer is not None and not isinstance(item, int):
            tokens = runs[index].tokens[sent[index] : item.tokens]
            sent[index] = item.tokens
            logprobs = chat_logprobs(tokenizer, scored(tokens)) if tokens else None
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}
        payload = {**base, "choices": [{**choice, **extra}]}
        # the counts as of this chunk (a choice's first has no token)
        usage.stamp(payload, runs[index].prompt_tokens, 0 if isinstance(item, int) else item.tokens)
        return sse_data(payload)

    for index in range(len(runs)):
        yield chunk(index, {"role": "assistant", "content": ""})
    try:
        async for item in samples.events():
            if item.done:
                outcome = runs[item.index].outcome
                assert outcome is not None
                finish = {
                    "finish_reason": chat_finish_reason(outcome),
                    "stop_reason": stop_reason(outcome),
                }
                yield chunk(item, {}, **finish)
            elif item.event is None:
                yield KEEPALIVE
            else:
                delta = _delta(item.event)
                if delta is not None:
                    yield chunk(item, delta)
    except Exception as exc:  # the engine failed mid-stream: say so in-band, then end
        for frame in failed_stream_end(exc):
            yield frame
        return
    if usage.include:
        total = combined([run.outcome for run in runs])  # type: ignore[misc]
        # llama.cpp's server ends its stream with its ``timings`` too
        yield sse_data(
            {**base, "choices": [], "usage": usage_block(total), "timings": total.timings()}
        )
    yield DONE
