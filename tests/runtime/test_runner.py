"""The model runner's decode steps: made once per lane count, for the pool they address."""

from __future__ import annotations

import numpy as np

from ninfer_runtime.models import load_model
from ninfer_runtime.runner import ModelRunner


def test_a_decode_step_is_made_once_per_lane_count_and_pool(artifact_path, monkeypatch) -> None:
    runner = ModelRunner(load_model(artifact_path("qwen3_5_bf16", "dense")))
    made = []
    compile_step = runner.backend.compile_step

    def counted(fn, shapes):
        made.append(shapes[0][0])  # every input is one int per lane
        return compile_step(fn, shapes)

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
