"""Samples reduced to figures: per concurrency level in ``vllm bench serve``'s terms (TTFT,
TPOT, ITL, E2EL, throughput), and per agent mode by turn, with the share of prompt tokens the
prefix cache served."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .errors import BenchError
from .sample import Sample


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def mean(values: list[float]) -> float:
    """The mean, NaN for no values (shown as n/a)."""
    return statistics.fmean(values) if values else float("nan")


@dataclass
class Level:
    concurrency: int
    samples: list[Sample]
    duration: float
    #: what ran, for messages: "server" or "engine"
    kind: str = "server"

    def stats(self) -> dict[str, float]:
        ok = [s for s in self.samples if s.ok]
        if not ok:
            errors = sorted({s.error for s in self.samples if s.error})
            raise BenchError(
                f"C={self.concurrency}, {self.kind}: none of the {len(self.samples)} requests "
                f"produced a token ({errors[0] if errors else 'no error given'})"
            )
        ttft = [s.ttft for s in ok if not math.isnan(s.ttft)]
        tpot = [t for s in ok if (t := s.tpot) is not None]
        itl = [x for s in ok for x in s.itl]
        e2el = [s.e2el for s in ok]
        out = sum(s.output_tokens for s in ok)
        ms = 1000.0
        return {
            "ok": len(ok), "failed": len(self.samples) - len(ok),
            "duration_s": self.duration,
            "input_tokens": sum(s.prompt_tokens for s in ok), "output_tokens": out,
            "req_s": len(ok) / self.duration, "out_tok_s": out / self.duration,
            # requests whose TTFT is the server's own (their tokens showed no text)
            "ttft_from_server": sum(s.ttft_source == "server" for s in ok),
            "ttft_mean": mean(ttft) * ms, "ttft_p50": pct(ttft, 50) * ms,
            "ttft_p99": pct(ttft, 99) * ms,
            "tpot_mean": mean(tpot) * ms, "tpot_p50": pct(tpot, 50) * ms,
            "tpot_p99": pct(tpot, 99) * ms,
            "itl_mean": mean(itl) * ms, "itl_p50": pct(itl, 50) * ms,
            "itl_p99": pct(itl, 99) * ms,
            "e2el_p50": pct(e2el, 50) * ms, "e2el_p99": pct(e2el, 99) * ms,
            "server_ttft_mean": mean([s.server_ttft for s in ok]) * ms,
            "server_prefill_mean": mean([s.server_prefill for s in ok]) * ms,
            "server_itl_mean": mean([s.server_itl for s in ok]) * ms,
        }  # fmt: skip


def agent_stats(by_turn: list[list[Sample]], duration: float, preemptions: float) -> dict:
    def timed(samples: list[Sample]) -> list[Sample]:
        """The samples with a TTFT (a NaN, from a failed request, would break a sort by it)."""
        return [s for s in samples if s.ok and not math.isnan(s.ttft)]

    def ttft(samples: list[Sample]) -> dict[str, float]:
        values = [s.ttft * 1000 for s in timed(samples)]
        return {"ttft_mean": mean(values), "ttft_p50": pct(values, 50), "ttft_p90": pct(values, 90)}

    def share(samples: list[Sample]) -> float:
        prompt = sum(s.prompt_tokens for s in samples if s.ok)
        return sum(s.cached_tokens for s in samples if s.ok) / prompt if prompt else 0.0

    every = [s for turn in by_turn for s in turn]
    ok = [s for s in every if s.ok]
    return {
        "ok": len(ok), "failed": len(every) - len(ok), "duration_s": duration,
        "prompt_tokens": sum(s.prompt_tokens for s in ok),
        "cached_tokens": sum(s.cached_tokens for s in ok),
        "output_tokens": sum(s.output_tokens for s in ok),
        "out_tok_s": sum(s.output_tokens for s in ok) / duration,
        "cached_share": share(every), "preemptions": preemptions,
        "ttft_sources": sorted({s.ttft_source for s in ok}),
        "first_turn": ttft(by_turn[0]),
        # the clients after the first the server took: all arrive at once, and only the first
        # must read the shared prefix whole
        "first_turn_followers": ttft(sorted(timed(by_turn[0]), key=lambda s: s.ttft)[1:]),
        "later_turns": ttft([s for turn in by_turn[1:] for s in turn]),
        "turns": [
            {"turn": i + 1, "requests": len(turn), "prompt_tokens_mean": statistics.fmean(
                [s.prompt_tokens for s in turn if s.ok] or [0]),
             "cached_share": share(turn), **ttft(turn)}
            for i, turn in enumerate(by_turn)
        ],
    }  # fmt: skip
