"""The model runner's decode steps: made once per lane count, for the pool they address; short
chunks as one compiled multi-row step."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.models import load_model
from ninfer_runtime.runner import ModelRunner
from tests.speculation import short_chunks_against_prefill


def test_a_decode_step_is_made_once_per_lane_count_and_pool(artifact_path, monkeypatch) -> None:
    runner = ModelRunner(load_model(artifact_path("qwen3_5_bf16", "dense")))
    made = []
    compile_step = runner.backend.compile_step

    def counted(fn, shapes, capture=True):
        made.append(shapes[0][0])  # every input is one int per lane
        return compile_step(fn, shapes, capture)

    monkeypatch.setattr(runner.backend, "compile_step", counted)
    pool, other = (runner.new_pool(lanes=2, max_context=32) for _ in range(2))
    a, b, c = pool.open(32), pool.open(32), other.open(32)
    one = [np.array([5])]
    for states in ([a], [a], [a, b], [a, b], [c], [a]):
        runner.forward(one * len(states), states)
    # pool: 1 lane, 2 lanes; other: 1 lane; back to pool: its steps are made again
    assert made == [1, 2, 1, 1]
    assert (a.length, b.length, c.length) == (5, 2, 1)


def test_prefill_computes_the_logits_it_returns_and_no_others(artifact_path, monkeypatch) -> None:
    """Chunks before the last take only their last row's logits; the last chunk's rows
    (or, last_only, its last row) come back, equal to the whole prompt's."""
    runner = ModelRunner(load_model(artifact_path("qwen3_5_bf16", "dense")))
    ids = np.arange(3, 40)
    whole = runner.forward([ids], [runner.new_state(40)]).logits[0]
    rows = []
    logits = runner.model.logits

    def counted(h):
        rows.append(h.shape[0])
        return logits(h)

    monkeypatch.setattr(runner.model, "logits", counted)
    out = runner.prefill(ids, runner.new_state(40), chunk=16)
    assert rows == [1, 1, 5]  # chunks of 16, 16 and the last 5 rows
    np.testing.assert_allclose(out.logits[0], whole[32:], rtol=1e-5, atol=1e-5)
    rows.clear()
    out = runner.prefill(ids, runner.new_state(40), chunk=16, last_only=True)
    assert rows == [1, 1, 1] and out.logits[0].shape == (1, whole.shape[1])
    np.testing.assert_allclose(out.logits[0][0], whole[-1], rtol=1e-5, atol=1e-5)
    assert out.hidden[0].shape[0] == len(ids)


@pytest.mark.parametrize(
    ("kind", "lanes", "tokens"), [("dense", 1, 2), ("dense", 3, 8), ("moe", 2, 5)]
)
def test_short_chunks_run_as_one_step_equal_to_prefill(artifact_path, kind, lanes, tokens) -> None:
    """A few tokens per lane in a pool made for them: one compiled step whose logits, K/V
    (the decode step after reads them) and GDN states equal prefilling the same chunk."""
    from ninfer_runtime.backends.cpu import CpuBackend

    err, scale, state_err = short_chunks_against_prefill(
        artifact_path("qwen3_5_bf16", kind), CpuBackend, lanes=lanes, tokens=tokens, seed=lanes
    )
    assert scale > 0 and err < 1e-5 * scale, (err, scale)
    assert state_err < 1e-5, state_err


def test_chunks_longer_than_the_pools_step_rows_are_prefilled(artifact_path, monkeypatch) -> None:
    runner = ModelRunner(load_model(artifact_path("qwen3_5_bf16", "dense")))
    chunks = []
    chunk = runner._chunk

    def counted(lanes, ids, last_only):
        chunks.append(sum(len(i) for i in ids))
        return chunk(lanes, ids, last_only)

    monkeypatch.setattr(runner, "_chunk", counted)
    pool = runner.new_pool(lanes=2, max_context=64, step_rows=4)
    a, b = pool.open(64), pool.open(64)
    runner.forward([np.arange(5)], [a])  # 5 > 4: a chunk
    runner.forward([np.arange(4)], [a])  # a step
    runner.forward([np.arange(3), np.arange(3)], [a, b])  # a step of two lanes
    runner.forward([np.arange(3), np.arange(2)], [a, b])  # uneven lanes: a chunk
    assert chunks == [5, 5]
    assert (a.length, b.length) == (15, 5)
