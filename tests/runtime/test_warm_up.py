"""The server's warm-up (``ninfer_runtime.warm_up``): one prefill chunk through a scratch
sequence leaves the engine as it found it: every slot and page free again, nothing in the
prefix cache, and the same greedy answers as an engine never warmed."""

from __future__ import annotations

import pytest

from ninfer_runtime.engine import Engine, GenerationRequest, TokenEvent
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.warm_up import warm_up

QUESTIONS = ["What is the capital of France?", "Name a primary color."]


def answers(engine: Engine) -> list[list[int]]:
    out = []
    for question in QUESTIONS:
        request = GenerationRequest(
            messages=[{"role": "user", "content": question}],
            sampling=SamplingParams(temperature=0.0, max_tokens=12),
        )
        out.append([e.token_id for e in engine.generate(request) if isinstance(e, TokenEvent)])
    return out


@pytest.mark.parametrize("chunk", [64, 1000])  # 1000: more than the context, cut to fit
def test_warm_up_leaves_the_engine_as_it_found_it(bundled_bf16, chunk: int) -> None:
    cold = Engine(bundled_bf16, max_context=256, prefill_chunk=chunk, prefix_cache=True)
    warmed = Engine(bundled_bf16, max_context=256, prefill_chunk=chunk, prefix_cache=True)
    slots, pages = warmed.pool.free_slots, warmed.pool.free_pages
    assert warm_up(warmed) > 0
    assert (warmed.pool.free_slots, warmed.pool.free_pages) == (slots, pages)
    assert warmed.pool_bytes() == cold.pool_bytes()
    assert answers(warmed) == answers(cold)
