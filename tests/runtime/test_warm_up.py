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


@pytest.mark.parametrize(
    ("chunk", "context", "capacity"),
    # 1000 tokens: cut to the context (256), or to the pool's two 256-token pages (2048)
    [(64, 256, None), (1000, 256, None), (1000, 2048, "1.6MiB")],
)
def test_warm_up_leaves_the_engine_as_it_found_it(
    bundled_bf16, chunk: int, context: int, capacity: str | None
) -> None:
    options = {"max_context": context, "prefill_chunk": chunk, "prefix_cache": True}
    cold = Engine(bundled_bf16, context_capacity=capacity, **options)
    warmed = Engine(bundled_bf16, context_capacity=capacity, **options)
    assert warmed.pool.free_pages * warmed.pool.page_tokens < chunk or capacity is None
    slots, pages = warmed.pool.free_slots, warmed.pool.free_pages
    assert warm_up(warmed) > 0
    assert (warmed.pool.free_slots, warmed.pool.free_pages) == (slots, pages)
    assert warmed.pool_bytes() == cold.pool_bytes()
    assert answers(warmed) == answers(cold)


def test_warm_up_with_drafting_and_with_experts_in_host_memory(bundled_bf16, q4_moe, shares):
    """The engines whose prefill does more (MTP's drafter rows; routed experts computed from
    host memory under a budget that keeps none on the device) warm up and give the same
    greedy answers as unwarmed ones."""
    from ninfer_runtime.engine import SpecConfig
    from tests.runtime.offload_runs import engine as offloaded

    drafting = {"max_context": 256, "spec": SpecConfig(draft_tokens=2)}
    cold, warmed = Engine(bundled_bf16, **drafting), Engine(bundled_bf16, **drafting)
    warm_up(warmed)
    assert answers(warmed) == answers(cold)
    floor, _ = shares
    cold, warmed = offloaded(q4_moe, floor), offloaded(q4_moe, floor)
    slots = warmed.pool.free_slots
    warm_up(warmed)
    assert warmed.pool.free_slots == slots
    assert answers(warmed) == answers(cold)
