"""Measured acceptance: greedy answers to the demo prompts through an ``Engine`` with rounds of
K drafts, against the same without."""

from __future__ import annotations

from typing import Any

from .results import AcceptanceResult

#: the demo prompts acceptance is measured on (chat messages, greedy)
DEMO_PROMPTS = (
    "What is the capital of France?",
    "Hello!",
    "What is two plus two?",
    "Tell me a joke.",
)


def _generate_all(engine: Any, max_tokens: int) -> tuple[list[list[int]], float]:
    """Greedy answers to the demo prompts, one at a time: their token ids and decode seconds."""
    from ..engine import Finished, GenerationRequest, TokenEvent
    from ..frontend.sampling import SamplingParams

    answers, seconds = [], 0.0
    for prompt in DEMO_PROMPTS:
        request = GenerationRequest(
            messages=[{"role": "user", "content": prompt}],
            sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
        )
        ids = []
        for event in engine.generate(request):
            if isinstance(event, TokenEvent):
                ids.append(event.token_id)
            elif isinstance(event, Finished):
                seconds += event.decode_seconds
        answers.append(ids)
    return answers, seconds


def measure_acceptance(
    artifact: Any,
    backend: str,
    draft_tokens: list[int],
    *,
    max_tokens: int = 64,
    kv_dtype: str = "float32",
) -> list[AcceptanceResult]:
    """Measured acceptance and tok/s of greedy generation on ``DEMO_PROMPTS`` through an
    ``Engine`` with rounds of each K in ``draft_tokens``, against the same without."""
    from ..engine import Engine
    from ..speculative import SpecConfig

    def engine(spec: SpecConfig | None) -> Engine:
        return Engine(artifact, backend=backend, max_lanes=1, kv_dtype=kv_dtype, spec=spec)

    reference = engine(None)
    _generate_all(reference, 4)  # warm-up: compiled steps, caches
    plain, plain_s = _generate_all(reference, max_tokens)
    del reference  # its weights go before the next engine loads its own
    tokens = sum(len(a) for a in plain)
    out = []
    for k in draft_tokens:
        spec = engine(SpecConfig(draft_tokens=k))
        _generate_all(spec, 4)
        stats = spec.spec_stats
        assert stats is not None
        rounds, accepted, drafted = stats.rounds, stats.accepted, stats.drafted
        answers, seconds = _generate_all(spec, max_tokens)  # counted from here
        rounds, accepted = stats.rounds - rounds, stats.accepted - accepted
        drafted = stats.drafted - drafted
        del spec
        generated = sum(len(a) for a in answers)
        out.append(
            AcceptanceResult(
                k,
                len(DEMO_PROMPTS),
                generated,
                accepted / drafted if drafted else 0.0,
                1 + accepted / rounds if rounds else 0.0,
                generated / seconds,
                tokens / plain_s,
                answers == plain,
            )
        )
    return out
