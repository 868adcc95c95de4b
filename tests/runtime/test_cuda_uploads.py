"""``backends/cuda/uploads.upload`` against a stand-in for CuPy (no GPU needed): the bytes go
through pinned staging in a copy the host does not wait for, on the current stream, and each
staging is kept until an event after its copy says the copy is done."""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.backends.cuda import uploads


class _Event:
    def __init__(self) -> None:
        self.done = False


class _Stream:
    def __init__(self) -> None:
        self.capturing = False
        self.events: list[_Event] = []

    def is_capturing(self) -> bool:
        return self.capturing

    def record(self) -> _Event:
        self.events.append(_Event())
        return self.events[-1]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {"stream": _Stream(), "copies": [], "pinned": []}

    def empty_pinned(shape: Any, dtype: Any) -> np.ndarray:
        a = np.empty(shape, dtype)
        seen["pinned"].append(a)
        return a

    class Device(np.ndarray):
        @property
        def data(self) -> Any:
            out = self

            def copy_from_host_async(address: int, nbytes: int, stream: Any) -> None:
                source = next(a for a in seen["pinned"] if a.ctypes.data == address)
                seen["copies"].append((source, nbytes, stream))
                out[...] = source

            return types.SimpleNamespace(copy_from_host_async=copy_from_host_async)

    cp = types.ModuleType("cupy")
    cp.cuda = types.SimpleNamespace(get_current_stream=lambda: seen["stream"])  # type: ignore[attr-defined]
    cp.empty = lambda shape, dtype: np.empty(shape, dtype).view(Device)  # type: ignore[attr-defined]
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = empty_pinned  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    monkeypatch.setattr(uploads, "_PENDING", type(uploads._PENDING)())
    return seen


def test_the_copy_is_from_pinned_staging_and_not_waited_for(fake: dict[str, Any]) -> None:
    host = np.arange(12, dtype=np.int64).reshape(3, 4)
    out = uploads.upload(host)
    np.testing.assert_array_equal(out.view(np.ndarray), host)
    ((source, nbytes, stream),) = fake["copies"]
    assert source is fake["pinned"][0] and nbytes == host.nbytes and stream is fake["stream"]


def test_a_staging_is_kept_until_its_copy_is_done(fake: dict[str, Any]) -> None:
    uploads.upload(np.zeros(4, np.int32))
    uploads.upload(np.ones(4, np.int32))
    first, second = fake["stream"].events
    assert [s for _, s in uploads._PENDING] == fake["pinned"]  # neither copy done: both kept
    first.done = True
    uploads.upload(np.ones(2, np.int32))  # the next upload lets the finished one's staging go
    assert [s is fake["pinned"][0] for _, s in uploads._PENDING] == [False, False]
    assert len(uploads._PENDING) == 2 and not second.done


def test_no_upload_under_a_capture(fake: dict[str, Any]) -> None:
    fake["stream"].capturing = True
    with pytest.raises(RuntimeError, match="cannot be captured"):
        uploads.upload(np.zeros(2, np.int32))
    assert not fake["copies"]
