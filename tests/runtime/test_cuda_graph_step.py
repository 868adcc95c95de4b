"""When a captured decode step (``backends/cuda/graphs.GraphStep``) runs eagerly, captures and
replays, checked on any machine with a stand-in for CuPy's streams and graphs: the first call
runs eagerly, the second loads the kernels only captures launch, then captures and replays,
later ones replay; a new epoch (the backend's ``forget_graphs``) makes the next call eager and
the one after capture again; an epoch of None (``decode_eagerly``) runs every call eagerly;
and what the epoch raises (a host node's failure) stops the step before it runs. The GPU run:
every captured-step test in tests/gpu."""

from __future__ import annotations

import contextlib
import importlib
import sys
import types

import numpy as np
import pytest


class Stream:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self) -> None:
        pass

    def begin_capture(self) -> None:
        self.log.append("begin")

    def end_capture(self):
        self.log.append("end")
        return types.SimpleNamespace(launch=lambda stream: self.log.append("replay"))


class Buffer:
    def __init__(self, shape) -> None:
        self.values = np.zeros(shape, np.int32)

    def set(self, values, stream=None) -> None:
        self.values[...] = values


@pytest.fixture
def graphs(monkeypatch):
    """``graphs.py`` imported against a stand-in ``cupy``; the real modules (on a machine
    that has them) are back afterwards."""
    import ninfer_runtime.backends.cuda as cuda_package

    name = "ninfer_runtime.backends.cuda.graphs"
    stub = types.ModuleType("cupy")
    stub.zeros, stub.int32 = (lambda shape, dtype=None: Buffer(shape)), np.int32
    stub.cuda = types.SimpleNamespace(using_allocator=lambda malloc: contextlib.nullcontext())
    monkeypatch.setitem(sys.modules, "cupy", stub)
    monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.delattr(cuda_package, "graphs", raising=False)
    module = importlib.import_module(name)
    yield module
    sys.modules.pop(name, None)
    if getattr(cuda_package, "graphs", None) is module:
        delattr(cuda_package, "graphs")


class Out:
    def copy(self):
        return self


def make_step(graphs, epoch):
    log: list[str] = []
    # the kernels only captures launch, loaded before each capture begins (a fresh import)
    graphs.load_capture_only = lambda: log.append("load")

    def fn(ids):
        log.append("run")
        return (Out(),)

    step = graphs.GraphStep(fn, [(1,)], Stream(log), types.SimpleNamespace(malloc=None), epoch)
    return step, log


def calls(step, log, n: int) -> list[list[str]]:
    """What each of ``n`` calls did."""
    out = []
    for _ in range(n):
        before = len(log)
        step(np.array([7]))
        out.append(log[before:])
    return out


EAGER, CAPTURE, REPLAY = ["run"], ["load", "begin", "run", "end", "replay"], ["replay"]


def test_first_eager_then_captured_then_replayed(graphs):
    step, log = make_step(graphs, lambda: 0)
    assert calls(step, log, 4) == [EAGER, CAPTURE, REPLAY, REPLAY]
    assert step.inputs[0].values.tolist() == [7]


def test_a_new_epoch_runs_once_eagerly_and_captures_again(graphs):
    epoch = [0]
    step, log = make_step(graphs, lambda: epoch[0])
    assert calls(step, log, 3) == [EAGER, CAPTURE, REPLAY]
    epoch[0] += 1
    assert calls(step, log, 3) == [EAGER, CAPTURE, REPLAY]


def test_no_epoch_runs_every_call_eagerly(graphs):
    epoch: list[int | None] = [0]
    step, log = make_step(graphs, lambda: epoch[0])
    assert calls(step, log, 2) == [EAGER, CAPTURE]
    epoch[0] = None
    assert calls(step, log, 3) == [EAGER, EAGER, EAGER]


def test_what_the_epoch_raises_stops_the_step(graphs):
    def failing() -> int:
        raise RuntimeError("a host node's function failed")

    step, log = make_step(graphs, failing)
    with pytest.raises(RuntimeError, match="host node"):
        step(np.array([7]))
    assert log == []
