"""The prefix cache and preemption on the CUDA backend (graphs on), on the bundled model:
answers with the cache equal cold answers (checkpoints kept inside reads or at their ends
alike), a chat turn resumes after the shared history, and
a pool too small for every lane's generation preempts (replaying, or through host memory)
to the same streams, with and without speculative decoding."""

from __future__ import annotations

from pathlib import Path

import pytest

from ninfer_runtime.engine import (
    SHORT_CHUNK_TOKENS,
    Engine,
    Finished,
    GenerationRequest,
    TokenEvent,
)
from ninfer_runtime.frontend import SamplingParams
from tests.bundled import BUNDLED

from .conftest import requires_gpu

pytestmark = requires_gpu

SYSTEM = "You are a tiny demo model bundled with ninfer. " * 12
QUESTIONS = ["What is the capital of France?", "Tell me a joke.", "Hello!", "Name a color."]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ninfer_convert.pipeline import convert

    out = tmp_path_factory.mktemp("cache_bundled") / "tiny.ninfer"
    convert("tiny_mixed", {"base": str(BUNDLED)}, out)
    return out


def _answers(engine: Engine, questions: list[str], **sampling) -> list[tuple[list[int], int]]:
    out = []
    for q in questions:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        params = SamplingParams(**{"temperature": 0.0, "max_tokens": 48, **sampling})
        ids, cached = [], None
        for e in engine.generate(GenerationRequest(messages=messages, sampling=params)):
            if isinstance(e, TokenEvent):
                ids.append(e.token_id)
            elif isinstance(e, Finished):
                cached = e.usage.cached_tokens
        out.append((ids, cached))
    return out


def test_cached_answers_equal_cold_answers(artifact: Path) -> None:
    kw = dict(backend="cuda", max_context=1024, checkpoint_interval=32)
    cold = _answers(Engine(artifact, **kw), QUESTIONS * 2)
    warm = _answers(Engine(artifact, prefix_cache=True, **kw), QUESTIONS * 2)
    assert [ids for ids, _ in warm] == [ids for ids, _ in cold]
    cached = [c for _, c in warm]
    assert cached[0] == 0 and all(c >= 32 for c in cached[1:])
    assert all(c > 32 for c in cached[len(QUESTIONS) :])  # the same prompts again


def test_checkpoints_inside_reads_resume_as_reads_that_stop_there(artifact: Path) -> None:
    """Checkpoints every 32 tokens and at each chat's history end, kept inside one read each
    prompt (``checkpoints_inside_reads``) or with the read stopping at each: the same answers
    from the same cached tokens."""
    kw = dict(backend="cuda", max_context=1024, checkpoint_interval=32, prefix_cache=True)
    inside, split = Engine(artifact, **kw), Engine(artifact, **kw)
    assert inside.scheduler.checkpoints_inside_reads
    split.scheduler.checkpoints_inside_reads = False
    assert _answers(inside, QUESTIONS * 2) == _answers(split, QUESTIONS * 2)


@pytest.mark.parametrize(
    ("host", "spec"), [("0", False), ("1GiB", False), ("0", True), ("1GiB", True)]
)
def test_a_small_pool_preempts_and_resumes(artifact: Path, host: str, spec: bool) -> None:
    """Four lanes in a pool of five pages (shared with the checkpoints): lanes are
    preempted, replayed (host 0) or copied to pinned host memory and back, with MTP rounds
    or without, and every greedy stream equals an unconstrained run's."""
    from ninfer_runtime.speculative import SpecConfig
    from ninfer_runtime.state import PAGE_TOKENS, ContextPool

    kw = dict(backend="cuda", max_lanes=4, max_context=1024)
    draft = SpecConfig(draft_tokens=3) if spec else None
    roomy = Engine(artifact, **kw)
    specs, mtp = roomy.runner.specs, roomy.runner.mtp_spec
    lane = roomy.runner.new_pool(
        lanes=1, max_context=8, draft_tokens=3 if spec else 0, step_rows=SHORT_CHUNK_TOKENS
    )
    budget = 4 * lane.slot_bytes + 5 * ContextPool.page_bytes_of(
        specs, mtp, PAGE_TOKENS, roomy.kv_dtype
    )
    params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)

    def run(engine: Engine) -> list[list[int]]:
        ids = {}
        for q in QUESTIONS:
            messages = [{"role": "user", "content": q}]
            ids[engine.submit(GenerationRequest(messages=messages, sampling=params))] = []
        while engine.has_work:
            for e in engine.step():
                if isinstance(e, TokenEvent):
                    ids[e.request_id].append(e.token_id)
        return list(ids.values())

    small = Engine(
        artifact, context_capacity=budget, prefix_cache=True, host_context_capacity=host,
        spec=draft, **kw,
    )  # fmt: skip
    assert small.pool.pages == 5
    assert run(small) == run(roomy)
    assert small.preemptions > 0
    assert (small.replayed_tokens > 0) == (host == "0")
    assert small.host_bytes == 0
