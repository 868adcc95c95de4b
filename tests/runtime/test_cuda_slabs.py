"""The ordering ``slabs.SlabBuffers`` sets up between its side stream and the caller's
stream, checked against a stand-in for CuPy's streams and events (no GPU needed): every
fill waits for the product that last read its buffer, every product for its fill, the two
buffers alternate, and a captured product gets a buffer of its own on the capturing
stream."""

from __future__ import annotations

import itertools
import sys
import types
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.backends.cuda.slabs import SlabBuffers


class _Log:
    def __init__(self) -> None:
        self.ops: list[tuple] = []
        self.capturing = False
        self.current: Any = None


class _Stream:
    def __init__(self, log: _Log, name: str) -> None:
        self.log, self.name = log, name

    def is_capturing(self) -> bool:
        return self.log.capturing and self.name == "main"

    def wait_event(self, event: Any) -> None:
        self.log.ops.append(("wait", self.name, event.id))

    def __enter__(self) -> _Stream:
        self.previous, self.log.current = self.log.current, self
        return self

    def __exit__(self, *exc: Any) -> None:
        self.log.current = self.previous


class _Event:
    count = 0

    def __init__(self, log: _Log) -> None:
        _Event.count += 1
        self.log, self.id = log, _Event.count

    def record(self, stream: Any = None) -> None:
        stream = stream or self.log.current
        self.log.ops.append(("record", stream.name, self.id))


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> _Log:
    log = _Log()
    main = _Stream(log, "main")
    log.current = main
    cp = types.ModuleType("cupy")
    cuda = types.SimpleNamespace(
        get_current_stream=lambda: log.current,
        Stream=lambda non_blocking: _Stream(log, "side"),
        Event=lambda block, disable_timing: _Event(log),
    )
    cp.cuda = cuda  # type: ignore[attr-defined]
    cp.empty = lambda n, dtype: np.zeros(n, dtype=dtype)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", cp)
    return log


def _fill(slabs: SlabBuffers, log: _Log, tag: int) -> tuple[Any, Any]:
    def dequantize(view: Any) -> None:
        log.ops.append(("dequant", log.current.name, tag))
        view[...] = tag

    view, ticket = slabs.fill(3, 4, np.uint16, dequantize)
    log.ops.append(("product", log.current.name, tag))
    slabs.release(ticket)
    return view, ticket


def test_fills_run_on_the_side_stream_ordered_against_the_products(fake_cupy: _Log) -> None:
    log = fake_cupy
    slabs = SlabBuffers(64)
    views = [_fill(slabs, log, tag)[0] for tag in range(4)]
    # the two buffers alternate: fills 0 and 2 share one, 1 and 3 the other
    assert views[0].base is views[2].base and views[1].base is views[3].base
    assert views[0].base is not views[1].base
    ops = log.ops
    dequant = [i for i, op in enumerate(ops) if op[0] == "dequant"]
    assert all(ops[i][1] == "side" for i in dequant)
    products = [i for i, op in enumerate(ops) if op[0] == "product"]
    assert all(ops[i][1] == "main" for i in products)
    for tag in range(4):
        d, p = dequant[tag], products[tag]
        # the fill's ready event, recorded on the side stream after it, is what main waits
        # for before the product
        ready = next(op[2] for op in ops[d:p] if op[0] == "record" and op[1] == "side")
        assert ("wait", "main", ready) in ops[d:p]
        if tag >= 2:  # the buffer's previous product must be done before the fill
            done = next(
                op[2] for op in ops[products[tag - 2] :] if op[0] == "record" and op[1] == "main"
            )
            assert ("wait", "side", done) in ops[products[tag - 2] : d]


def test_a_new_buffers_first_fill_waits_for_the_callers_queued_work(fake_cupy: _Log) -> None:
    """A buffer made now may be memory CuPy's pool took back from arrays whose kernels are
    still queued on the caller's stream: the side stream's first fill into each buffer waits
    for an event the caller's stream recorded after everything queued before it."""
    log = fake_cupy
    slabs = SlabBuffers(64)
    for tag in range(2):  # the two buffers' first fills
        log.ops.append(("queued", "main", tag))  # the caller's earlier work
        _fill(slabs, log, tag)
    for tag in range(2):
        queued = log.ops.index(("queued", "main", tag))
        dequant = log.ops.index(("dequant", "side", tag))
        recorded = [
            op[2] for op in log.ops[queued:dequant] if op[0] == "record" and op[1] == "main"
        ]
        assert recorded and ("wait", "side", recorded[0]) in log.ops[queued:dequant]


def test_events_are_made_once_and_each_waited_on_before_its_next_record(fake_cupy: _Log) -> None:
    """Four events serve any number of fills (two a buffer), and none is recorded anew before
    the wait that needs its last record has been queued."""
    log = fake_cupy
    slabs = SlabBuffers(64)
    made = _Event.count
    for tag in range(9):
        _fill(slabs, log, tag)
    assert _Event.count - made == 4
    records: dict[int, list[int]] = {}
    for i, op in enumerate(log.ops):
        if op[0] == "record":
            records.setdefault(op[2], []).append(i)
    for event, at in records.items():
        waits = [i for i, op in enumerate(log.ops) if op[0] == "wait" and op[2] == event]
        for a, b in itertools.pairwise(at):
            assert any(a < w < b for w in waits), (event, a, b)


def test_a_capture_fills_its_own_buffer_on_the_capturing_stream(fake_cupy: _Log) -> None:
    log = fake_cupy
    slabs = SlabBuffers(64)
    eager, _ = _fill(slabs, log, 1)
    log.capturing = True
    captured, ticket = _fill(slabs, log, 2)
    log.capturing = False
    assert ticket is None and captured.base is not eager.base
    assert ("dequant", "main", 2) in log.ops
    again, _ = _fill(slabs, log, 3)  # eager again: the other eager buffer, never the captured
    assert again.base is not captured.base and again.base is not eager.base
    assert np.all(captured == 2)  # eager fills never wrote the captured buffer


def test_a_slab_larger_than_a_buffer_is_refused(fake_cupy: _Log) -> None:
    slabs = SlabBuffers(16)
    assert slabs.rows(np.uint16, 4) == 2
    with pytest.raises(ValueError, match="more than a 16-byte buffer"):
        slabs.fill(3, 4, np.uint16, lambda view: None)
