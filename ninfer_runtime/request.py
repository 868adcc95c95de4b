"""What a request to the engine asks for, and the events it gets back.

``GenerationRequest`` is what ``Engine.submit`` takes; ``Event`` is what ``Engine.step``
returns, request by request: tokens (``TokenEvent``), the prompt's scores
(``PromptLogprobs``), parsed output (``OutputEvent``), then ``Finished`` or ``Failed``. The
engine re-exports them all (``from ninfer_runtime.engine import GenerationRequest``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .frontend import ParseEvent, SamplingParams, StopReason
from .logprobs import TopLogprobs
from .media import ImageInput
from .prefix_cache import CacheBoundary

#: ``(logits [V] float32, answer token ids so far) -> logits``: a per-request hook run before
#: sampling (constrained decoding masks tokens with ``-inf``). It sees only the answer part:
#: it is not called while the output is still inside reasoning, so a grammar applies after
#: ``</think>`` and thinking stays free. Reasoning is bounded so the answer always comes: by
#: ``SamplingParams.max_thinking_tokens``; with a processor, by at most half of ``max_tokens``
#: too, and a stop token drawn inside reasoning ends the reasoning instead.
LogitsProcessor = Callable[[np.ndarray, Sequence[int]], np.ndarray]


@dataclass
class GenerationRequest:
    """What to generate from: chat ``messages`` (rendered with the chat template), a ``prompt``
    string tokenized as is, or ``prompt_ids``; exactly one of them."""

    messages: Sequence[Mapping[str, Any]] | None = None
    prompt: str | None = None
    prompt_ids: Sequence[int] | None = None
    tools: Sequence[Mapping[str, Any]] | None = None
    enable_thinking: bool | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None
    #: Leave the final assistant message open and continue it (assistant prefill).
    continue_final_message: bool = False
    #: End the prompt with the template's opening of an assistant turn (never when
    #: continuing the final message); off, the model continues after the last message.
    add_generation_prompt: bool = True
    sampling: SamplingParams = field(default_factory=SamplingParams)
    parse_output: bool = True
    #: Read ``<tool_call>`` blocks as calls; off, they stay text (``tool_choice: none``).
    parse_tool_calls: bool = True
    logits_processor: LogitsProcessor | None = None
    request_id: str = field(default_factory=lambda: f"req-{uuid.uuid4().hex[:16]}")
    #: The prefix-cache namespace: checkpoints this request keeps are stored under it and
    #: its lookup finds only checkpoints kept under the same salt (None: the unsalted one).
    cache_salt: str | None = None
    #: Prompt positions where this request's prefill may keep a checkpoint for others that
    #: share the prompt up to there; the engine keeps the few worth most (``checkpoint_plan``).
    cache_boundaries: Sequence[CacheBoundary] = ()
    #: The images of ``messages``, in the order their ``{"type": "image"}`` content parts
    #: appear there.
    images: Sequence[ImageInput] = ()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    #: Generated tokens that were reasoning (up to and including ``</think>``).
    reasoning_tokens: int = 0
    #: Speculative decoding: drafted tokens verification kept, and those it turned down.
    accepted_draft_tokens: int = 0
    rejected_draft_tokens: int = 0
    #: The request's images (their tokens count in ``prompt_tokens``), and how many of them
    #: the media cache served without running the vision encoder.
    images: int = 0
    cached_images: int = 0


@dataclass(frozen=True)
class TokenEvent:
    """A generated token. With ``SamplingParams.logprobs = k``: its log-probability and the
    k most likely tokens at its position (``logprobs`` module docs: what they are computed
    from); both None when the request asked for none."""

    request_id: str
    token_id: int
    logprob: float | None = None
    top_logprobs: TopLogprobs | None = None


@dataclass(frozen=True)
class PromptLogprobs:
    """With ``SamplingParams.prompt_logprobs = k``, once the prompt is read (before the first
    token): per prompt token its log-probability given the tokens before it and the k most
    likely tokens there; None for the first token, which nothing predicts."""

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float | None, ...]
    top_logprobs: tuple[TopLogprobs | None, ...]


@dataclass(frozen=True)
class OutputEvent:
    """A parsed piece of the reply: reasoning, text or a tool-call delta (frontend.parsers)."""

    request_id: str
    event: ParseEvent


@dataclass(frozen=True)
class Finished:
    request_id: str
    reason: str  # "stop" | "length" | "cancelled"
    stop: StopReason | None
    usage: Usage
    prompt_seconds: float
    decode_seconds: float


@dataclass(frozen=True)
class Failed:
    """A request ended by an error of its own (its sampling or its logits processor raised);
    its lane and memory are freed and the other requests go on."""

    request_id: str
    error: Exception


Event = TokenEvent | PromptLogprobs | OutputEvent | Finished | Failed
