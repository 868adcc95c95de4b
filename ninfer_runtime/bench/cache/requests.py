"""What both cache measurements ask of the engine: greedy requests of a fixed length."""

from __future__ import annotations

from ...frontend import SamplingParams


def greedy_params(max_tokens: int) -> SamplingParams:
    # a random model may draw an end-of-sequence token at any point: the lengths stay fixed
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
