"""What ``ninfer-bench run`` measures, one dataclass a kind of row: each rate beside its floor,
with the derived figures as properties, and ``as_row`` for ``--json`` and ``--record``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: per-position acceptance rates at which the speculative table gives the implied tok/s
ACCEPTANCE_RATES = (0.0, 0.5, 0.68, 0.8, 1.0)


@dataclass
class DecodeResult:
    lanes: int
    context: int
    tokens_per_s: float
    step_ms: float
    bytes_per_step: int
    floor_ms: float

    @property
    def percent_of_floor(self) -> float:
        return 100 * self.floor_ms / self.step_ms


def expected_tokens(rate: float, draft_tokens: int) -> float:
    """Tokens a lane gains per round when each draft is accepted with probability ``rate``
    (given the ones before it): sum of rate**j for j = 0..K."""
    return sum(rate**j for j in range(draft_tokens + 1))


@dataclass
class SpecResult:
    """A speculative round (``speculate`` + ``commit``) against a plain decode step."""

    lanes: int
    context: int
    draft_tokens: int
    step_ms: float
    round_ms: float
    bytes_per_round: int
    floor_ms: float

    @property
    def ratio(self) -> float:
        return self.round_ms / self.step_ms

    @property
    def percent_of_floor(self) -> float:
        return 100 * self.floor_ms / self.round_ms

    @property
    def plain_tokens_per_s(self) -> float:
        return 1e3 * self.lanes / self.step_ms

    def tokens_per_s(self, rate: float) -> float:
        """What rounds give at per-position acceptance ``rate``."""
        return 1e3 * self.lanes * expected_tokens(rate, self.draft_tokens) / self.round_ms

    def speedup(self, rate: float) -> float:
        return self.tokens_per_s(rate) / self.plain_tokens_per_s


@dataclass
class DraftStepResult:
    """One MTP draft step (block + head) scoring the proposal rows and the full vocabulary."""

    lanes: int
    context: int
    proposal_rows: int
    optimized_ms: float
    full_ms: float
    optimized_bytes: int
    full_bytes: int
    floor_bw: float

    @property
    def optimized_floor_ms(self) -> float:
        return 1e3 * self.optimized_bytes / self.floor_bw

    @property
    def full_floor_ms(self) -> float:
        return 1e3 * self.full_bytes / self.floor_bw


@dataclass
class AcceptanceResult:
    """Greedy generation of the demo prompts with rounds of K drafts and without."""

    draft_tokens: int
    prompts: int
    tokens: int
    acceptance: float
    tokens_per_round: float
    tokens_per_s: float
    plain_tokens_per_s: float
    same_tokens: bool

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.plain_tokens_per_s


@dataclass
class PrefillResult:
    tokens: int
    chunk: int
    tokens_per_s: float
    seconds: float
    flops: float
    floor_s: float

    @property
    def percent_of_floor(self) -> float:
        return 100 * self.floor_s / self.seconds


@dataclass
class PrefillSegment:
    """Part of one long prompt's prefill: tokens ``start .. end - 1``, read after ``start``
    tokens already in the context (their attention FLOPs grow with it)."""

    start: int
    end: int
    seconds: float
    flops: float
    floor_s: float

    @property
    def tokens_per_s(self) -> float:
        return (self.end - self.start) / self.seconds

    @property
    def percent_of_floor(self) -> float:
        return 100 * self.floor_s / self.seconds


def as_row(result: Any) -> dict[str, Any]:
    """A result's fields and derived figures (its properties), as ``--json`` writes them."""
    derived = {
        n: getattr(result, n) for n, v in vars(type(result)).items() if isinstance(v, property)
    }
    row = {**asdict(result), **derived}
    if isinstance(result, SpecResult):
        row["tokens_per_s_at"] = {f"{a:g}": result.tokens_per_s(a) for a in ACCEPTANCE_RATES}
        row["speedup_at"] = {f"{a:g}": result.speedup(a) for a in ACCEPTANCE_RATES}
    return row
