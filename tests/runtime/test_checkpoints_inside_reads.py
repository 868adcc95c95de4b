"""Checkpoints kept inside a prefill read (``batch.Mark``, ``LaneCheckpoints.marks``), on the
CPU reference with the bundled Qwen3.5 model, a tiny GLM5Next and a tiny Qwen4Exp with PLE:
a read runs through the positions where checkpoints go instead of stopping at each, its
layers with slot states (Gated DeltaNet, KDA, PLE) saving them into the snapshot as they
pass one. The checkpoint resumes a later
request with the tokens a checkpoint at the end of a read gives, and with those of a cold
run; a snapshot that not every layer filled is let go, and a model that keeps none inside
reads refuses marks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ninfer_runtime.engine import CacheBoundary, Engine, GenerationRequest, TokenEvent
from ninfer_runtime.errors import EngineError
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.lane_checkpoints import MarkCapture, save_captures
from ninfer_runtime.models.batch import Mark
from tests.runtime.test_prefix_cache import _check_pool

BOUNDARY, TAIL, CHUNK = 150, 40, 256


@pytest.fixture(scope="module")
def artifact(bundled_bf16: Path) -> Path:
    return bundled_bf16


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(5)
    shared = rng.integers(0, 500, BOUNDARY).tolist()
    return [shared + rng.integers(0, 500, TAIL).tolist() for _ in range(2)]


def _request(prompt: list[int]) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=prompt,
        sampling=SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
        parse_output=False,
        cache_boundaries=[CacheBoundary(BOUNDARY, "boundary")],
    )


def _serve(engine: Engine, prompt: list[int]) -> tuple[list[int], int, list[tuple[int, int]]]:
    """Greedy tokens, cached tokens and the prefill reads (start, end) of one request."""
    reads: list[tuple[int, int]] = []
    plan = engine.scheduler.prefill_reads

    def logged():
        chosen = plan()
        reads.extend((start, end) for _, start, end in chosen)
        return chosen

    engine.scheduler.prefill_reads = logged  # type: ignore[method-assign]
    try:
        events = list(engine.generate(_request(prompt)))
    finally:
        del engine.scheduler.prefill_reads
    tokens = [e.token_id for e in events if isinstance(e, TokenEvent)]
    return tokens, events[-1].usage.cached_tokens, reads


@pytest.fixture(scope="module")
def glm5_next(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tiny = pytest.importorskip("tests.tiny_glm5_next")
    root = tmp_path_factory.mktemp("inside_glm")
    tiny.convert("glm5_next_bf16", tiny.build_tiny_glm5_next(root / "ckpt"), root / "m.ninfer")
    return root / "m.ninfer"


@pytest.mark.parametrize("model", ["qwen3_5", "glm5_next", "qwen4_exp"])
def test_a_read_keeps_the_boundary_inside_it_and_a_later_request_resumes_there(request, model):
    fixture = {"qwen3_5": "artifact", "glm5_next": "glm5_next", "qwen4_exp": "qwen4_exp_ple"}
    artifact = request.getfixturevalue(fixture[model])
    engine = Engine(artifact, max_context=512, prefill_chunk=CHUNK, prefix_cache=True)
    assert engine.scheduler.checkpoints_inside_reads
    first, second = _prompts()
    tokens, cached, reads = _serve(engine, first)
    assert cached == 0 and reads == [(0, len(first))]  # one read, through the boundary
    assert engine.cache.contains(first[:BOUNDARY])
    assert engine.cache.checkpoint_counts()["boundary"] == 1
    _check_pool(engine)
    again, cached, reads = _serve(engine, second)
    assert cached == BOUNDARY and reads == [(BOUNDARY, len(second))]
    cold = Engine(artifact, max_context=512, prefill_chunk=CHUNK)
    assert [tokens, again] == [_serve(cold, p)[0] for p in (first, second)]

    # the same as a checkpoint kept at the end of a read that stops at the boundary
    split = Engine(artifact, max_context=512, prefill_chunk=CHUNK, prefix_cache=True)
    split.scheduler.checkpoints_inside_reads = False
    assert _serve(split, first)[2] == [(0, BOUNDARY), (BOUNDARY, len(first))]
    assert _serve(split, second)[:2] == (again, BOUNDARY)


def test_a_snapshot_that_not_every_layer_filled_is_let_go(artifact):
    engine = Engine(artifact, max_context=512, prefill_chunk=CHUNK, prefix_cache=True)
    pool, checkpoints = engine.pool, engine.scheduler.checkpoints
    engine.submit(_request(_prompts()[0]))
    list(engine.scheduler.admit())  # its lane, its plan (the boundary) made
    (lane,) = engine.scheduler.active.values()
    before = pool.free_pages
    (capture,) = checkpoints.marks(lane, 0, len(lane.prompt_ids))
    assert isinstance(capture, MarkCapture) and capture.position == BOUNDARY
    assert pool.free_pages == before - pool.snapshot_pages
    gdn = [m for m in pool.memories() if m.slot_parts()]
    for memory in gdn[:-1]:  # the last Gated DeltaNet layer never saves
        save_captures([capture], memory.slot_parts())
    assert not capture.complete
    checkpoints.keep_marks([capture], {})
    assert pool.free_pages == before and pool.snapshot_pages_used == 0
    assert not engine.cache.contains(list(lane.prompt_ids[:BOUNDARY]))


def test_a_model_that_keeps_none_inside_reads_refuses_marks(artifact):
    engine = Engine(artifact, max_context=512)
    state = engine.pool.open(64)
    engine.runner.model.checkpoints_inside_reads = False
    with pytest.raises(EngineError, match="keeps no checkpoints inside a read"):
        mark = Mark(4, None, lambda keys, states: None)
        engine.runner.forward([np.arange(8)], [state], marks=[[mark]])
