"""A packed prefill chunk's mixers, counted on the CPU reference with the bundled Qwen3.5
model: its keys and values are stored in one ``write`` call an attention layer, and its
recurrent layers read every lane's rows in one ``prefill`` call a layer (a call a round
where a checkpoint inside a read cuts the lanes), with a round's marks saved in one call;
and the packed chunk's rows equal each lane prefilled alone."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.backends.base import to_numpy
from ninfer_runtime.models import load_model
from ninfer_runtime.models.batch import Mark
from ninfer_runtime.ops import registry
from ninfer_runtime.runner import ModelRunner

LENGTHS = (7, 19, 12)


@pytest.fixture(scope="module")
def runner(bundled_bf16: Path) -> ModelRunner:
    return ModelRunner(load_model(bundled_bf16))


def _counted(calls: Counter, family: str, op: str) -> Any:
    real = registry.resolve(family, op, device="cpu", key_dim=0, value_dim=0, taps=4)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[op] += 1
        if op == "prefill":
            calls["segments"] += len(args[6])
        return real(*args, **kwargs)

    return counted


def _layers(runner: ModelRunner) -> Counter:
    kinds = Counter()
    for memory in runner.new_pool(lanes=1, max_context=64).layers:  # the MTP layer's aside
        kinds["recurrent" if memory.slot_parts() else "attention"] += 1
    return kinds


def _packed(runner: ModelRunner, ids: list[np.ndarray], marks: Any = None) -> tuple:
    pool = runner.new_pool(lanes=len(ids), max_context=64, snapshots=2)
    states = [pool.open(64) for _ in ids]
    calls: Counter = Counter()
    with (
        registry.patched("delta_rule", "prefill", _counted(calls, "delta_rule", "prefill")),
        registry.patched("attention", "write", _counted(calls, "attention", "write")),
    ):
        out = runner.forward(ids, states, marks=marks)
    return calls, [to_numpy(logits) for logits in out.logits]


def test_a_packed_chunk_makes_one_call_a_layer_and_equals_each_lane_alone(runner) -> None:
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 500, n) for n in LENGTHS]
    layers = _layers(runner)
    calls, packed = _packed(runner, ids)
    assert calls["write"] == layers["attention"]
    assert calls["prefill"] == layers["recurrent"]
    assert calls["segments"] == layers["recurrent"] * len(ids)
    for lane, alone in zip(packed, (_packed(runner, [i])[1][0] for i in ids), strict=True):
        np.testing.assert_allclose(lane, alone, rtol=1e-5, atol=1e-5)


def test_a_mark_makes_a_round_and_its_lanes_marks_are_saved_together(runner) -> None:
    """Two lanes cut at a mark each: two calls a recurrent layer (every lane's first piece,
    then every lane's second), and one save a layer for both marks."""
    rng = np.random.default_rng(1)
    ids = [rng.integers(0, 500, n) for n in LENGTHS[:2]]
    saves: list[tuple[list[str], int]] = []

    def saver(keys: list[str], states: Any) -> None:
        saves.append((list(keys), len(states)))

    marks = [[Mark(3, "a", saver)], [Mark(10, "b", saver)]]
    calls, _ = _packed(runner, ids, marks)
    layers = _layers(runner)
    assert calls["prefill"] == 2 * layers["recurrent"]
    assert saves == [(["a", "b"], 2)] * layers["recurrent"]
