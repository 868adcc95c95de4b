"""Speculative decoding's settings, counters and acceptance rules.

A round (``ModelRunner.speculate``) gives every lane K drafted tokens and the main model's
logits at the K+1 positions they fill. Which of them a request keeps:

* greedy, no penalties: the longest prefix of drafts equal to the main model's argmax, then
  its argmax after them (``accept_greedy``): the output is exactly plain greedy decoding's;
* anything else (sampling, penalties): the speculative-sampling rule, position by position
  (``accept_draft``): draft x, drawn from q, is kept with probability min(1, p(x) / q(x)),
  else a token is drawn from normalize(max(0, p - q)) and the round ends there; if every
  draft is kept, one more token is drawn from p at the last position. p is the request's
  own distribution (every sampling parameter, penalties counting the drafts before it), so
  the tokens are distributed exactly as plain sampling's. Our drafter proposes its most
  likely token, so q is the point mass on it: x is kept with probability p(x), else the
  token comes from p without x.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .errors import EngineError
from .frontend.sampling import Sampler, draw

#: draft methods the engine runs; the block-diffusion drafters are refused by name
METHODS = ("mtp",)
NOT_YET = ("dflash", "dflash2")
MAX_DRAFT_TOKENS = 5
PROPOSAL_HEADS = ("optimized", "full")


@dataclass(frozen=True)
class SpecConfig:
    """``method`` drafts ``draft_tokens`` (1..5) tokens a round; ``proposal_head``: the
    drafter scores only the artifact's indexed proposal rows (``optimized``, when it has
    them) or the whole vocabulary (``full``). Verification always uses the full head."""

    method: str = "mtp"
    draft_tokens: int = 3
    proposal_head: str = "optimized"

    def __post_init__(self) -> None:
        if self.method in NOT_YET:
            raise EngineError(
                f"speculative method {self.method!r} is not available yet; use 'mtp' or 'off'"
            )
        if self.method not in METHODS:
            raise EngineError(f"speculative method {self.method!r}: expected 'mtp' or 'off'")
        k = self.draft_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_DRAFT_TOKENS:
            raise EngineError(
                f"draft_tokens {k!r}: {self.method} drafts 1..{MAX_DRAFT_TOKENS} tokens a round"
            )
        if self.proposal_head not in PROPOSAL_HEADS:
            raise EngineError(
                f"proposal_head {self.proposal_head!r}: expected 'optimized' or 'full'"
            )


@dataclass
class SpecStats:
    """Counters since the engine started: ``rounds`` (one per speculating lane and round),
    tokens ``drafted`` and ``accepted``, how often the draft at each position (0-based) was
    accepted, and ``fallbacks``: lanes in a round that kept one token without speculating
    (their next tokens constrained by a logits processor or a closing thinking budget)."""

    draft_tokens: int
    rounds: int = 0
    fallbacks: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.accepted_per_position:
            self.accepted_per_position = [0] * self.draft_tokens

    def record(self, accepted: int) -> None:
        self.rounds += 1
        self.drafted += self.draft_tokens
        self.accepted += accepted
        for j in range(accepted):
            self.accepted_per_position[j] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts per drafted token (0 before any round)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Tokens a speculating lane gains per round: the accepted drafts plus one."""
        return 1 + self.accepted / self.rounds if self.rounds else 0.0


def accept_greedy(drafts: Sequence[int], targets: Sequence[int]) -> list[int]:
    """The tokens a greedy request keeps: drafts while they equal the main model's argmax
    (``targets[j]`` follows drafts 1..j), then the argmax after the last kept one."""
    m = 0
    while m < len(drafts) and int(drafts[m]) == int(targets[m]):
        m += 1
    return [int(t) for t in drafts[:m]] + [int(targets[m])]


def accept_draft(p: np.ndarray, q: np.ndarray, draft: int, rng: np.random.Generator) -> int | None:
    """One position of speculative sampling: ``p`` the target's and ``q`` the drafter's
    probabilities (dense [V]), ``draft`` drawn from q. None: the draft is kept; else the
    token drawn in its place from normalize(max(0, p - q))."""
    if rng.random() * q[draft] < p[draft]:  # kept with probability min(1, p / q)
        return None
    residual = np.maximum(p - q, 0.0)
    ids = np.flatnonzero(residual)
    return draw(ids, residual[ids] / residual[ids].sum(), rng)


def accept_sampled(sampler: Sampler, drafts: Sequence[int], rows: np.ndarray) -> list[int]:
    """The tokens a sampling request keeps from one round: ``rows`` [K+1, V] are the main
    model's logits at the round's positions (row j after drafts 1..j). The drafter's q is
    the point mass on each draft. The sampler's random stream drives every choice."""
    vocab = rows.shape[-1]
    kept: list[int] = []
    for j, x in enumerate(int(d) for d in drafts):
        p = dense(*sampler.probabilities(rows[j], extra=kept), vocab)
        q = np.zeros(vocab)
        q[x] = 1.0
        replaced = accept_draft(p, q, x, sampler.rng)
        if replaced is not None:
            return [*kept, replaced]
        kept.append(x)
    ids, probs = sampler.probabilities(rows[len(kept)], extra=kept)
    return [*kept, draw(ids, probs, sampler.rng)]


def dense(ids: np.ndarray, probs: np.ndarray, vocab: int) -> np.ndarray:
    out = np.zeros(vocab)
    out[ids] = probs
    return out
