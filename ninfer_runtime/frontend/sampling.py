"""The numpy reference sampler.

``Sampler`` holds one request's sampling state (seen tokens for penalties, its own random
generator) and turns a logits row into a token id as its ``SamplingParams`` (``sampling_params``)
say. Order of operations, as in HF / vLLM:

    penalties (repetition over prompt + output, presence/frequency over output)
    -> greedy argmax when temperature == 0
    -> temperature -> top_k -> top_p -> min_p -> draw

The random draw uses a per-request ``numpy.random.Generator`` seeded from ``seed``, so a seeded
request reproduces its tokens whatever else runs in the batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from ninfer_runtime.frontend._errors import EngineError

# The parameters are re-exported: callers have long imported them from here.
from ninfer_runtime.frontend.sampling_params import (
    MAX_LOGPROBS,
    MIN_REPETITION_PENALTY,
    SamplingParams,
)

__all__ = [
    "MAX_LOGPROBS",
    "MIN_REPETITION_PENALTY",
    "Sampler",
    "SamplingParams",
    "draw",
    "sample_lanes",
]


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
