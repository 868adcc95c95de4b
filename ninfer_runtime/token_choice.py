"""Choosing each lane's next token from its logits, as its request asks.

``TokenChooser.choose`` samples every lane of a step (``Sampler``: temperature, top-k/p,
penalties, the seed), where the logits are when the backend's device sampler serves every
lane (only the token ids cross to the host), else row by row on the host with the lane's
logits processor. On either path the engine's own rules come first: stop tokens are held
back until ``min_tokens`` (``held_stops``), a spent thinking budget writes ``</think>``
(``forced``), and a constrained request that draws a stop inside its reasoning closes the
reasoning instead so that its answer follows. A lane asking for logprobs gets its token's
score here too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .arrays import array_module
from .backends.base import to_numpy
from .frontend import Tokenizer
from .logprobs import TokenLogprobs, score_rows, token_logprobs
from .models import ForwardOutput
from .request import Event
from .scheduler import Lane


class TokenChooser:
    """The next tokens of one engine's lanes, over its ``model`` (its vocabulary and its
    backend's device sampler, if any) and ``tokenizer`` (the stop and ``</think>`` ids).
    ``fail`` ends a lane whose own sampling or logits processor raised."""

    def __init__(
        self,
        model: Any,
        tokenizer: Tokenizer,
        fail: Callable[[Lane, Exception, list[Event]], None],
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.fail = fail
        #: the backend's sampler on the device (None: every lane is sampled on the host)
        self.device_sampler = model.backend.device_sampler()

    def choose(
        self, lanes: list[Lane], out: ForwardOutput, events: list[Event]
    ) -> list[tuple[Lane, int, TokenLogprobs | None]]:
        """Each lane's next token, and its score for a lane asking for logprobs; a lane
        whose own sampling fails is ended with ``Failed`` (in ``events``) and left out, so
        one request's error never stops the others."""
        if not lanes:  # every lane of the step was replaying
            return []
        forced = [self.forced(a) for a in lanes]
        on_device = self.device_sampler is not None and all(
            self.device_sampler.supports(a.request.sampling)
            and (a.request.logits_processor is None or a.answer_start is None)
            for a in lanes
        )
        if on_device:  # only the token ids cross to the host
            sampler = self.device_sampler
            sampler.set_lanes([(a.request.sampling, a.seed, len(a.generated)) for a in lanes])
            rows = out.last_logits
            if rows is None:
                rows = self.model.backend.xp.concatenate([row[-1:] for row in out.logits])
            drawn_ids = sampler.sample(self._hold_stops(lanes, rows))
            # no lane here has penalties: its rows, where they are, are what it is scored on.
            # Scored on the drawn ids before they are read, so one wait covers both
            tops = [a.request.sampling.logprobs for a in lanes]
            scores = score_rows(rows, drawn_ids, tops)
            drawn = [int(t) for t in to_numpy(drawn_ids)]
            tokens = [
                self._answer_instead_of_stop(a, t if f is None else f)
                for a, t, f in zip(lanes, drawn, forced, strict=True)
            ]
            # a forced token, or an answer instead of a stop, is scored as itself
            changed = [k if t != d else None for k, t, d in zip(tops, tokens, drawn, strict=True)]
            for i, score in enumerate(score_rows(rows, tokens, changed)):
                if score is not None:
                    scores[i] = score
            return list(zip(lanes, tokens, scores, strict=True))
        picked = []
        for a, row, token in zip(lanes, out.logits, forced, strict=True):
            top = a.request.sampling.logprobs
            try:
                scores = scored = None
                if token is None or top is not None:  # a forced token needs no row
                    scores = to_numpy(row[-1]).astype(np.float32, copy=False)
                if top is not None:  # penalised by the tokens before this one only
                    scored = a.sampler.penalized(scores)
                if token is None:
                    process = a.request.logits_processor
                    if process is not None and a.answer_start is not None:
                        scores = process(scores.copy(), a.generated[a.answer_start :])
                    held = self.held_stops(a)
                    if held and np.isfinite(np.delete(scores, held)).any():
                        # a grammar that admits only a stop wins: the output ends there
                        scores = scores.copy()
                        scores[held] = -np.inf
                    token = a.sampler.sample(scores)
                else:
                    a.sampler.accept(token)  # counts for the penalties like a drawn token
                token = self._answer_instead_of_stop(a, token)
                score = None if top is None else token_logprobs(scored[None], [token], [top])[0]
                picked.append((a, token, score))
            except Exception as exc:  # this request's parameters or hook, not the engine's
                self.fail(a, exc, events)
        return picked

    def held_stops(self, a: Lane) -> list[int]:
        """The stop token ids (EOS unless ignored, ``stop_token_ids``) lane ``a`` may not
        draw yet: all of them while it has fewer than ``min_tokens`` tokens, else none."""
        params = a.request.sampling
        if len(a.generated) >= params.min_tokens:
            return []
        vocab = self.model.config.vocab
        eos = () if params.ignore_eos else self.tokenizer.eos_token_ids
        return sorted({t for t in (*eos, *params.stop_token_ids) if t < vocab})

    def _hold_stops(self, lanes: list[Lane], rows: Any) -> Any:
        """``rows`` (lane i's logits, on the device) with the stop tokens each lane may not
        draw yet at -inf: a copy when any lane has some (the rows themselves are scored for
        logprobs as they are), else ``rows`` as given. The device twin of the host path's
        masking in ``choose``."""
        held = [(i, self.held_stops(a)) for i, a in enumerate(lanes)]
        held = [(i, ids) for i, ids in held if ids]
        if not held:
            return rows
        xp = array_module(rows)
        rows = rows.copy()
        for i, ids in held:
            rows[i, xp.asarray(ids)] = -xp.inf
        return rows

    def forced(self, a: Lane) -> int | None:
        """The token the thinking budget imposes now: once it is spent, ``</think>``."""
        if a.answer_start is not None or a.thinking_budget is None:
            return None
        close = self.tokenizer.think_close_ids
        at = len(a.generated) - max(a.thinking_budget - len(close), 0)
        return close[at] if 0 <= at < len(close) else None

    def _answer_instead_of_stop(self, a: Lane, token: int) -> int:
        """A constrained request must answer: a stop token drawn inside its reasoning spends
        the thinking budget there, so ``</think>`` and then the grammar's answer follow."""
        if (
            a.answer_start is None
            and a.request.logits_processor is not None
            and a.stops.is_stop_token(token)
        ):
            a.thinking_budget = len(a.generated) + len(self.tokenizer.think_close_ids)
            forced = self.forced(a)
            return token if forced is None else forced
        return token
