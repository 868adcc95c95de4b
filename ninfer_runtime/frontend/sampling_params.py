"""Sampling parameters: the validated, frozen form of a request's sampling fields.

OpenAI / vLLM semantics: each field is checked here so a bad request fails with a
``RequestError`` naming the field, and ``SamplingParams.resolve`` lays request fields over the
model's defaults (``Tokenizer.generation_defaults``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ninfer_runtime.frontend._errors import request_error

__all__ = ["MAX_LOGPROBS", "MIN_REPETITION_PENALTY", "SamplingParams"]


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise request_error(f"{name} must be a number, got {value!r}", name)
    if math.isnan(value) or math.isinf(value):
        raise request_error(f"{name} must be finite, got {value!r}", name)
    return float(value)


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise request_error(f"{name} must be an integer, got {value!r}", name)
    return int(value)


#: Seen tokens' positive logits are divided by the repetition penalty: below this, float32
#: logits overflow to inf and no token can be sampled.
MIN_REPETITION_PENALTY = 0.01
#: The most alternatives a request may ask to see beside each scored token (OpenAI's bound).
MAX_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each token of one request.

    ``top_k = 0`` and ``top_p = 1`` and ``min_p = 0`` switch those filters off; ``temperature = 0``
    is greedy. ``max_tokens = None`` leaves the limit to the engine (context or server default).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = None
    #: The most tokens reasoning may take, its closing tag included; then the engine closes it.
    max_thinking_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    #: No EOS, stop token or stop string ends the output before it has this many tokens:
    #: those tokens are masked until then (vLLM's ``min_tokens``).
    min_tokens: int = 0
    #: Special tokens (other than the markers the output parser reads) vanish from the text.
    skip_special_tokens: bool = True
    #: Score every generated token: its log-probability and this many most likely tokens
    #: beside it (0..MAX_LOGPROBS); None: nothing scored. See ``ninfer_runtime.logprobs``.
    logprobs: int | None = None
    #: Score every prompt token given the ones before it (the first has no score), with this
    #: many most likely tokens at each position (0..MAX_LOGPROBS); None: not scored.
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        temperature = _number("temperature", self.temperature)
        if temperature < 0:
            raise request_error(f"temperature must be >= 0, got {temperature}", "temperature")
        set_(self, "temperature", temperature)
        top_p = _number("top_p", self.top_p)
        if not 0 < top_p <= 1:
            raise request_error(f"top_p must be in (0, 1], got {top_p}", "top_p")
        set_(self, "top_p", top_p)
        top_k = _integer("top_k", self.top_k)
        if top_k < 0:
            raise request_error(f"top_k must be >= 0 (0 = off), got {top_k}", "top_k")
        min_p = _number("min_p", self.min_p)
        if not 0 <= min_p <= 1:
            raise request_error(f"min_p must be in [0, 1], got {min_p}", "min_p")
        set_(self, "min_p", min_p)
        for name in ("presence_penalty", "frequency_penalty"):
            value = _number(name, getattr(self, name))
            if not -2 <= value <= 2:
                raise request_error(f"{name} must be in [-2, 2], got {value}", name)
            set_(self, name, value)
        repetition = _number("repetition_penalty", self.repetition_penalty)
        if repetition < MIN_REPETITION_PENALTY:
            raise request_error(
                f"repetition_penalty must be >= {MIN_REPETITION_PENALTY} (1 = off), "
                f"got {repetition}",
                "repetition_penalty",
            )
        set_(self, "repetition_penalty", repetition)
        if self.seed is not None:
            _integer("seed", self.seed)
        for name in ("max_tokens", "max_thinking_tokens"):
            value = getattr(self, name)
            if value is not None and _integer(name, value) < 1:
                raise request_error(f"{name} must be >= 1, got {value}", name)
        if _integer("min_tokens", self.min_tokens) < 0:
            raise request_error(f"min_tokens must be >= 0, got {self.min_tokens}", "min_tokens")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise request_error(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
                "min_tokens",
            )
        set_(self, "stop", self._stops(self.stop))
        set_(self, "stop_token_ids", self._token_ids(self.stop_token_ids))
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise request_error(f"{name} must be true or false", name)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= _integer(name, value) <= MAX_LOGPROBS:
                raise request_error(f"{name} must be in 0..{MAX_LOGPROBS}, got {value}", name)

    @staticmethod
    def _stops(stop: Any) -> tuple[str, ...]:
        """OpenAI accepts one string or a list; both become a tuple of non-empty strings."""
        if stop is None:
            return ()
        items = [stop] if isinstance(stop, str) else stop
        if not isinstance(items, Sequence):
            raise request_error("stop must be a string or a list of strings", "stop")
        for i, item in enumerate(items):
            if not isinstance(item, str) or not item:
                raise request_error(f"stop[{i}] must be a non-empty string", f"stop[{i}]")
        return tuple(items)

    @staticmethod
    def _token_ids(ids: Any) -> tuple[int, ...]:
        if ids is None:
            return ()
        if isinstance(ids, str) or not isinstance(ids, Iterable):
            raise request_error("stop_token_ids must be a list of token ids", "stop_token_ids")
        out = []
        for i, token in enumerate(ids):
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise request_error(
                    f"stop_token_ids[{i}] must be a token id (integer >= 0), got {token!r}",
                    f"stop_token_ids[{i}]",
                )
            out.append(int(token))
        return tuple(out)

    @property
    def greedy(self) -> bool:
        """Temperature 0: argmax, no randomness (ties go to the lowest id)."""
        return self.temperature == 0

    @classmethod
    def resolve(
        cls, defaults: Mapping[str, Any] | None = None, /, **request: Any
    ) -> SamplingParams:
        """Request fields over model defaults (``Tokenizer.generation_defaults``).

        ``None`` request values mean "not given" and fall through to the defaults, as unset
        OpenAI fields do; unknown names are a programming error, not a request error.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(request) - known)
        if unknown:
            raise TypeError(f"unknown sampling fields: {', '.join(unknown)}")
        merged = {k: v for k, v in (defaults or {}).items() if k in known and v is not None}
        merged.update({k: v for k, v in request.items() if v is not None})
        return cls(**merged)
