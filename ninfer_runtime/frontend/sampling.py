"""Sampling parameters and the numpy reference sampler.

``SamplingParams`` is the validated, frozen form of a request's sampling fields (OpenAI / vLLM
semantics). ``Sampler`` holds one request's sampling state (seen tokens for penalties, its own
random generator) and turns a logits row into a token id. Order of operations, as in HF / vLLM:

    penalties (repetition over prompt + output, presence/frequency over output)
    -> greedy argmax when temperature == 0
    -> temperature -> top_k -> top_p -> min_p -> draw

The random draw uses a per-request ``numpy.random.Generator`` seeded from ``seed``, so a seeded
request reproduces its tokens whatever else runs in the batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ninfer_runtime.frontend._errors import EngineError, request_error

__all__ = ["Sampler", "SamplingParams", "draw", "sample_lanes"]


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


class Sampler:
    """One request's sampler: penalties state, filters and its random generator.

    ``sample`` records the chosen token for the penalties by default; speculative decoding can
    sample with ``commit=False`` and ``accept`` the tokens that survive verification.
    """

    def __init__(self, params: SamplingParams, prompt_ids: Iterable[int] = ()) -> None:
        self.params = params
        self._prompt = np.fromiter((int(t) for t in prompt_ids), dtype=np.int64)
        self._counts: dict[int, int] = {}
        self._seen: np.ndarray | None = None  # bool [V], built on the first logits row
        self.rng = np.random.default_rng(_seed_sequence(params.seed))

    # -- state ----------------------------------------------------------------------------------

    def accept(self, token_ids: int | Iterable[int]) -> None:
        """Record generated tokens (they count for all three penalties from now on)."""
        for token in [token_ids] if isinstance(token_ids, int) else token_ids:
            token = int(token)
            self._counts[token] = self._counts.get(token, 0) + 1
            if self._seen is not None and 0 <= token < self._seen.size:
                self._seen[token] = True

    def _seen_mask(self, vocab: int) -> np.ndarray:
        if self._seen is None or self._seen.size != vocab:
            seen = np.zeros(vocab, dtype=bool)
            prompt = self._prompt[(self._prompt >= 0) & (self._prompt < vocab)]
            seen[prompt] = True
            for token in self._counts:
                if 0 <= token < vocab:
                    seen[token] = True
            self._seen = seen
        return self._seen

    # -- the math -------------------------------------------------------------------------------

    def penalized(self, logits: np.ndarray, extra: Sequence[int] = ()) -> np.ndarray:
        """A float32 copy of ``logits`` [V] with the penalties applied; ``extra`` tokens
        count as generated too, without being recorded (speculative drafts before it)."""
        out = np.array(logits, dtype=np.float32, copy=True)
        if out.ndim != 1:
            raise EngineError(f"Sampler expects one logits row [V], got shape {out.shape}")
        p = self.params
        tally = dict(self._counts)
        for token in extra:
            tally[int(token)] = tally.get(int(token), 0) + 1
        if p.repetition_penalty != 1.0:
            seen = self._seen_mask(out.size)
            if extra:
                seen = seen.copy()
                inside = [int(t) for t in extra if 0 <= int(t) < out.size]
                seen[inside] = True
            idx = np.flatnonzero(seen)
            values = out[idx]
            out[idx] = np.where(
                values > 0, values / p.repetition_penalty, values * p.repetition_penalty
            )
        if (p.presence_penalty or p.frequency_penalty) and tally:
            ids = np.fromiter(tally.keys(), dtype=np.int64)
            counts = np.fromiter(tally.values(), dtype=np.float32)
            keep = (ids >= 0) & (ids < out.size)
            ids, counts = ids[keep], counts[keep]
            out[ids] -= p.frequency_penalty * counts + p.presence_penalty
        return out

    def probabilities(
        self, logits: np.ndarray, extra: Sequence[int] = ()
    ) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, probabilities) of the candidates left after all filters (``extra``:
        see ``penalized``).

        Probabilities are float64 and sum to 1; ids ascend. Greedy gives the argmax alone.
        """
        scores = self.penalized(logits, extra)
        top = float(scores.max()) if scores.size else math.nan
        if math.isnan(top) or math.isinf(top) or np.isnan(scores).any():
            raise EngineError("logits contain NaN or no finite value; cannot sample")
        p = self.params
        if p.greedy:
            return np.array([int(np.argmax(scores))]), np.ones(1)
        ids = None
        if 0 < p.top_k < scores.size:
            # temperature does not change the ranking, so top_k runs first, on the raw scores;
            # ties with the k-th score stay: no arbitrary cut
            kth = np.partition(scores, -p.top_k)[-p.top_k]
            ids = np.flatnonzero(scores >= kth)
            scores = scores[ids]
        finite = np.isfinite(scores)
        if not finite.all():  # masked tokens (-inf) are not candidates
            ids = np.flatnonzero(finite) if ids is None else ids[finite]
            scores = scores[finite]
        if ids is None:
            ids = np.arange(scores.size)
        # float64 division: a tiny temperature must give 0 (not NaN) away from the best token
        probs = np.exp((scores - top).astype(np.float64) / p.temperature)
        probs /= probs.sum()
        drawable = probs > 0  # underflowed to zero: could never be drawn
        if not drawable.all():
            ids, probs = ids[drawable], probs[drawable]
        if p.top_p < 1.0:
            chosen = _nucleus(probs, p.top_p)
            ids, probs = ids[chosen], probs[chosen]
        if p.min_p > 0.0:
            keep = probs >= p.min_p * probs.max()
            ids, probs = ids[keep], probs[keep]
        return ids, probs / probs.sum()

    def sample(self, logits: np.ndarray, *, commit: bool = True) -> int:
        """The next token for this request (recorded for the penalties unless ``commit=False``)."""
        token = draw(*self.probabilities(logits), self.rng)
        if commit:
            self.accept(token)
        return token


def draw(ids: np.ndarray, probs: np.ndarray, rng: np.random.Generator) -> int:
    """One of ``ids`` with probabilities ``probs`` (a lone candidate takes no random draw)."""
    if ids.size == 1:
        return int(ids[0])
    cumulative = np.cumsum(probs)
    at = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(ids[min(at, ids.size - 1)])


def sample_lanes(samplers: Sequence[Sampler], logits: np.ndarray) -> np.ndarray:
    """One token per lane from a batch of logits rows ``[B, V]`` (lane i uses ``samplers[i]``).

    Each lane keeps its own parameters and generator, so a lane's tokens do not depend on which
    other requests share the batch.
    """
    if logits.ndim != 2 or logits.shape[0] != len(samplers):
        raise EngineError(
            f"sample_lanes: logits shape {logits.shape} does not match {len(samplers)} lanes"
        )
    return np.array([s.sample(row) for s, row in zip(samplers, logits, strict=True)], np.int64)


def _nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Ascending indices of the smallest most-probable set whose mass reaches ``top_p``.

    Sorting a 250k vocabulary costs tens of milliseconds per token, while the nucleus is
    usually a few hundred tokens: sort only the largest ``m`` probabilities, growing ``m`` until
    they hold ``top_p`` of the mass. Ties are broken towards lower ids among the candidates.
    """
    size = probs.size
    m = min(size, 512)
    while True:
        top = np.arange(size) if m == size else np.sort(np.argpartition(-probs, m - 1)[:m])
        order = top[np.argsort(-probs[top], kind="stable")]
        sorted_probs = probs[order]
        mass_before = np.cumsum(sorted_probs) - sorted_probs
        if m == size or mass_before[-1] + sorted_probs[-1] >= top_p:
            return np.sort(order[mass_before < top_p])
        m = min(size, m * 8)


def _seed_sequence(seed: int | None) -> np.random.SeedSequence:
    """Signed seeds (OpenAI allows negatives) map to distinct non-negative entropy."""
    if seed is None:
        return np.random.SeedSequence()
    return np.random.SeedSequence([abs(seed), 1 if seed < 0 else 0])
