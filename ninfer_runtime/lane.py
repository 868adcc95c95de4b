"""A request as the engine runs it (``Lane``), from ``submit`` to its end.

The record the scheduler, the intake, the token choice and the event writer all share: what
the request generates with (its sampler, stop matcher, detokenizer and parser), how far it
has read its prompt and generated, and where its memory is (a lane's state in the context
pool, a host copy while preempted, or nothing while it waits). It is not the model's
``models.batch.Lane``, which is one forward's rows of a sequence.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .frontend import DetokenizeStream, OutputParser, Sampler, StopMatcher
from .logprobs import TokenLogprobs
from .request import GenerationRequest
from .state import HostCopy, SequenceState

if TYPE_CHECKING:
    from .images import PromptImages


@dataclass
class Lane:
    """One request as the engine runs it, from ``submit`` to its end: what it generates
    with, how far it has read and generated, and its memory (``state``: its lane's memory
    in the pool, None while it waits)."""

    request: GenerationRequest
    prompt_ids: np.ndarray
    state: SequenceState
    sampler: Sampler
    stops: StopMatcher
    detokenizer: DetokenizeStream
    parser: OutputParser | None
    max_tokens: int
    #: Index in ``generated`` where the answer starts; ``None`` while still in reasoning.
    answer_start: int | None = 0
    #: Most reasoning tokens (``</think>`` included) before the engine writes ``</think>``.
    thinking_budget: int | None = None
    prefilled: int = 0
    generated: list[int] = field(default_factory=list)
    pending: int | None = None  # sampled token not yet fed to the model
    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    #: the device sampler's random stream (the request's seed, else a random one)
    seed: int = field(default_factory=lambda: secrets.randbits(63))
    drafted: int = 0
    accepted: int = 0
    #: prompt tokens resumed from a cached checkpoint instead of prefilled
    cached: int = 0
    #: with the prefix cache, where the prompt stops being what the next chat turn resends
    #: (it renders this turn's reply without the reasoning opener): a checkpoint goes there
    history_end: int | None = None
    #: tokens the lane resumed from at its latest admission (a checkpoint's length)
    resumed: int = 0
    #: after a preemption: generated tokens to feed again (never sampled, never emitted)
    #: before the lane generates; the last is its pending token
    replay: list[int] = field(default_factory=list)
    #: with speculation and the prefix cache: the main model's hidden row of the last token
    #: consumed before the current round (what a checkpoint at the lane's length keeps)
    last_hidden: Any = None
    #: while preempted to host memory: its memory there (resumed as it was, nothing replayed)
    saved: HostCopy | None = None
    #: with ``prompt_logprobs``: each prompt position's score as its chunk is read
    prompt_scores: list[TokenLogprobs | None] | None = None
    #: with the prefix cache: prompt positions (before its end) where its prefill stops and
    #: keeps a checkpoint besides every ``checkpoint_interval`` tokens, and their kinds
    plan: dict[int, str] = field(default_factory=dict)
    #: a prompt with images: their rows, the M-RoPE positions and the prefix-cache key
    images: PromptImages | None = None

    @property
    def cache_prompt(self) -> np.ndarray:
        """The prompt as the prefix cache keys it: its ids, an image's placeholders standing
        for the image's digest (``images.PromptImages.cache_ids``)."""
        return self.prompt_ids if self.images is None else self.images.cache_ids

    def open(self, state: SequenceState) -> None:
        """``state`` is the lane's memory now; positions after its prompt continue with the
        prompt's M-RoPE offset."""
        self.state = state
        state.rope_delta = 0 if self.images is None else self.images.rope_delta


#: one lane's prefill read in a step: the lane, and the prompt span ``start:end`` it reads
Read = tuple[Lane, int, int]
