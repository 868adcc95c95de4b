"""Speculative decoding: rounds, drafted and accepted tokens, acceptance by draft position.

The series exist (at 0) with speculation off, so boards find them; a round is one speculating
lane's draft-and-verify; positions are 0-based, one series each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter

if TYPE_CHECKING:
    from ninfer_runtime.speculative import SpecStats

__all__ = ["SpeculativeSeries"]


class SpeculativeSeries:
    """The speculative-decoding part of ``Metrics``."""

    _labels: dict[str, str]

    def _add_speculative_series(self, r: CollectorRegistry, draft_tokens: int) -> None:
        m = self._labels
        model_id = m["model_name"]
        self.spec_rounds = Counter(
            "ninfer_spec_decode_rounds", "Speculative rounds (per speculating lane)", registry=r
        )
        self.spec_drafted = Counter("ninfer_spec_decode_draft_tokens", "Tokens drafted", registry=r)
        self.spec_accepted = Counter(
            "ninfer_spec_decode_accepted_tokens", "Drafted tokens verification kept", registry=r
        )
        self.spec_fallbacks = Counter(
            "ninfer_spec_decode_fallback_steps",
            "Lanes in a round that kept one token without drafts (constrained next tokens)",
            registry=r,
        )
        per_position = Counter(
            "ninfer_spec_decode_accepted_per_position",
            "Rounds whose draft at this position was kept",
            ["position"],
            registry=r,
        )
        self.v_spec_drafts = Counter(
            "vllm:spec_decode_num_drafts", "Draft rounds", ["model_name"], registry=r
        ).labels(**m)
        self.v_spec_drafted = Counter(
            "vllm:spec_decode_num_draft_tokens", "Draft tokens", ["model_name"], registry=r
        ).labels(**m)
        self.v_spec_accepted = Counter(
            "vllm:spec_decode_num_accepted_tokens", "Accepted tokens", ["model_name"], registry=r
        ).labels(**m)
        v_per_position = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position",
            ["model_name", "position"],
            registry=r,
        )
        self._spec_positions = [
            (per_position.labels(str(j)), v_per_position.labels(model_id, str(j)))
            for j in range(draft_tokens)
        ]

    def speculated(self, gained: SpecStats) -> None:
        """What the engine's speculative counters gained since the previous call."""
        self.spec_rounds.inc(gained.rounds)
        self.spec_drafted.inc(gained.drafted)
        self.spec_accepted.inc(gained.accepted)
        self.spec_fallbacks.inc(gained.fallbacks)
        self.v_spec_drafts.inc(gained.rounds)
        self.v_spec_drafted.inc(gained.drafted)
        self.v_spec_accepted.inc(gained.accepted)
        for (ours, theirs), count in zip(
            self._spec_positions, gained.accepted_per_position, strict=True
        ):
            ours.inc(count)
            theirs.inc(count)
