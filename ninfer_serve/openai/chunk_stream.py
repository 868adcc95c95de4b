"""What the SSE streams of Chat and legacy Completions share: the ``usage`` each chunk carries
as ``stream_options`` ask, and the ends of a stream (``[DONE]``, after an in-band error when
the engine failed mid-stream)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import from_exception
from ..http import sse_data
from .models import StreamOptions

__all__ = ["DONE", "StreamUsage", "failed_stream_end"]

#: the last event of every stream
DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class StreamUsage:
    """The usage a stream reports: ``include_usage`` puts the totals in a last chunk of their
    own (and a null ``usage`` on every other chunk, as OpenAI does); vLLM's
    ``continuous_usage_stats`` puts the choice's counts so far on every chunk instead."""

    include: bool
    continuous: bool

    @classmethod
    def asked(cls, options: StreamOptions | None) -> StreamUsage:
        return cls(
            include=bool(options and options.include_usage),
            continuous=bool(options and options.continuous_usage_stats),
        )

    def stamp(self, payload: dict[str, Any], prompt_tokens: int, completion_tokens: int) -> None:
        """Set a chunk's ``usage`` from its choice's counts as of that chunk."""
        if self.continuous:
            payload["usage"] = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            }
        elif self.include:
            payload["usage"] = None


def failed_stream_end(error: BaseException) -> list[bytes]:
    """The last events of a stream whose generation failed after its 200 went out: the error
    in-band, then ``[DONE]``."""
    _, body = from_exception(error).openai()
    return [sse_data(body), DONE]
