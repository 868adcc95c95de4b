"""Scratch buffers for the dequantized weight slabs of prefill products, filled on a side
stream so that one slab's dequantization (memory-bound) runs while the product of the slab
before it (compute-bound) still holds the tensor cores.

Two buffers alternate: the side stream fills one once the product that last read it is
done (an event the caller's stream records), and the caller's stream waits for the fill
before its product. A buffer's first fill waits for everything the caller's stream had
queued when it was made: CuPy's pool may give it blocks that stream's pending kernels still
use. Under a CUDA graph capture everything runs on the capturing stream, in
a third buffer that eager work never touches (a captured graph holds its address and may be
replayed while eager slabs are in flight). Buffers are made once at full size and never
replaced, for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["SlabBuffers"]


class SlabBuffers:
    def __init__(self, nbytes: int):
        self.nbytes = nbytes  # of each buffer
        self._buffers: dict[tuple[str, Any], Any] = {}  # ("eager" 0/1 | "captured", dtype)
        self._free: list[Any] = [None, None]  # event after the last product that read each
        self._next = 0
        self._side: Any = None
        # each buffer's two events, made once and recorded anew at every use: a wait takes an
        # event as it stands when the wait is queued, and each is waited on before its next
        # record (``fill`` waits on ``ready`` at once; the next fill of the buffer, on ``done``)
        self._events: list[tuple[Any, Any]] = []

    def rows(self, dtype: Any, columns: int) -> int:
        """Rows of ``columns`` elements one buffer holds."""
        return max(1, self.nbytes // (np.dtype(dtype).itemsize * max(columns, 1)))

    def fill(
        self, rows: int, columns: int, dtype: Any, dequantize: Callable[[Any], None]
    ) -> tuple[Any, int | None]:
        """A ``[rows, columns]`` buffer view after ``dequantize(view)`` has run into it, the
        current stream made to wait for that; returns ``(view, ticket)`` and the caller
        passes the ticket to ``release`` once its product is queued."""
        import cupy as cp

        stream = cp.cuda.get_current_stream()
        if stream.is_capturing():
            view = self._view(("captured", np.dtype(dtype)), rows, columns, dtype)
            dequantize(view)
            return view, None
        i, self._next = self._next, self._next ^ 1
        key = (f"eager{i}", np.dtype(dtype))
        fresh = key not in self._buffers
        view = self._view(key, rows, columns, dtype)
        if self._side is None:
            self._side = cp.cuda.Stream(non_blocking=True)
            self._events = [
                tuple(cp.cuda.Event(block=False, disable_timing=True) for _ in range(2))
                for _ in range(2)
            ]
        if fresh:
            # the pool may hand a new buffer memory that kernels queued on this stream still
            # use (freed arrays' blocks are reused in this stream's order, not the side
            # stream's): its first fill waits for everything queued here so far
            done = self._events[i][1]
            done.record(stream)
            self._free[i] = done
        if self._free[i] is not None:
            self._side.wait_event(self._free[i])
        ready = self._events[i][0]
        with self._side:
            dequantize(view)
            ready.record(self._side)
        stream.wait_event(ready)
        return view, i

    def release(self, ticket: int | None) -> None:
        """The product that read ticket's buffer is queued on the current stream."""
        if ticket is None:
            return
        import cupy as cp

        done = self._events[ticket][1]
        done.record(cp.cuda.get_current_stream())
        self._free[ticket] = done

    def _view(self, key: tuple[str, Any], rows: int, columns: int, dtype: Any) -> Any:
        import cupy as cp

        size = rows * columns
        if size * np.dtype(dtype).itemsize > self.nbytes:
            raise ValueError(f"slab of {rows} x {columns}: more than a {self.nbytes}-byte buffer")
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = self._buffers[key] = cp.empty(self.nbytes // np.dtype(dtype).itemsize, dtype)
        return buffer[:size].reshape(rows, columns)
