"""Checkpoints at request-named boundaries on the CUDA backend (graphs on), on the bundled
model: requests sharing a long prompt prefix, submitted together, wait for the first one's
boundary checkpoint and resume there, with the same greedy tokens as with no boundaries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ninfer_runtime.engine import CacheBoundary, Engine, Finished, GenerationRequest, TokenEvent
from ninfer_runtime.frontend import SamplingParams
from tests.bundled import BUNDLED

from .conftest import requires_gpu

pytestmark = requires_gpu

SHARED = 320


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ninfer_convert.pipeline import convert

    out = tmp_path_factory.mktemp("boundaries_bundled") / "tiny.ninfer"
    convert("tiny_mixed", {"base": str(BUNDLED)}, out)
    return out


def _run(engine: Engine, prompts: list[list[int]], boundaries: bool) -> list[tuple[list[int], int]]:
    """Every prompt submitted at once: each one's greedy tokens and cached tokens."""
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    marks = [CacheBoundary(SHARED, "breakpoint")] if boundaries else []
    ids = [
        engine.submit(GenerationRequest(prompt_ids=p, sampling=params, cache_boundaries=marks))
        for p in prompts
    ]
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    cached: dict[str, int] = {}
    while engine.has_work:
        for e in engine.step():
            if isinstance(e, TokenEvent):
                tokens[e.request_id].append(e.token_id)
            elif isinstance(e, Finished):
                cached[e.request_id] = e.usage.cached_tokens
    return [(tokens[rid], cached[rid]) for rid in ids]


def test_boundaries_keep_the_greedy_tokens(artifact: Path) -> None:
    rng = np.random.default_rng(0)
    system = rng.integers(0, 500, SHARED).tolist()
    prompts = [system + rng.integers(0, 500, 10).tolist() for _ in range(4)]
    kw = dict(backend="cuda", max_lanes=4, max_context=1024, prefill_chunk=64, prefix_cache=True)
    plain = _run(Engine(artifact, **kw), prompts, boundaries=False)
    marked = _run(Engine(artifact, **kw), prompts, boundaries=True)
    assert [t for t, _ in marked] == [t for t, _ in plain]
    assert [c for _, c in plain] == [0, 0, 0, 0]
    assert [c for _, c in marked] == [0, SHARED, SHARED, SHARED]
