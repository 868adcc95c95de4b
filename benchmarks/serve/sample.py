"""What one request measured, whoever timed it: the HTTP client or the engine alone."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Sample:
    #: seconds to the first token; NaN until known (a stream that showed no output)
    ttft: float = float("nan")
    #: who measured ``ttft``: "client" (first streamed chunk carrying output), "server" (its
    #: mean for the level, when the tokens decoded to no text) or "engine" (first token event)
    ttft_source: str = "client"
    e2el: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    itl: list[float] = field(default_factory=list)
    #: mean TTFT the server measured (request admitted to first token out of the engine)
    server_ttft: float = float("nan")
    #: mean prefill time the server measured (the engine taking it to its first token)
    server_prefill: float = float("nan")
    #: mean gap between tokens the server measured
    server_itl: float = float("nan")
    #: first token to last, as the server measured this request (its stream's ``timings``)
    server_decode: float = float("nan")
    ok: bool = False
    text: str = ""
    #: why the request failed (HTTP status and body, or the error sent in the stream)
    error: str = ""

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2 or math.isnan(self.ttft):
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)
