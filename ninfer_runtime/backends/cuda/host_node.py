"""A host function as one step of the device's stream: its inputs copied to pinned host
buffers, the function called when the stream reaches it, its output copied back, all queued
without a synchronisation, so a decode step holding one can still be captured as a CUDA graph
(the call becomes a host node of the graph, replayed with it).

The function runs on the CUDA driver's callback thread, and the stream waits for it: the work
queued after it starts once it returns. It must not call CUDA (numpy and torch's CPU kernels
are fine). Its buffers are made once per input shapes and kept, so a captured graph's copies
keep their addresses; the stream orders one call's copies before the next call's. An
exception inside the function cannot cross the driver's thread: the output is filled with NaN
and ``check`` raises it at the caller's next call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import cupy as cp
import cupyx
import numpy as np

log = logging.getLogger("ninfer.cuda")


@dataclass
class _Buffers:
    inputs: tuple[np.ndarray, ...]
    output: np.ndarray


class HostNode:
    """``fn(*host_inputs) -> host array or None`` (None: zeros) as a step of the current
    stream: ``node(*device_inputs) -> device output`` of ``output_shape(*input_shapes)``."""

    def __init__(
        self,
        fn: Callable[..., np.ndarray | None],
        output_shape: Callable[..., tuple[int, ...]],
        dtype: Any = np.float32,
    ):
        self.fn, self.output_shape, self.dtype = fn, output_shape, np.dtype(dtype)
        self._buffers: dict[tuple[Any, ...], _Buffers] = {}
        self.failure: BaseException | None = None

    def __call__(self, *inputs: Any) -> Any:
        self.check()
        stream = cp.cuda.get_current_stream()
        inputs = tuple(cp.ascontiguousarray(a) for a in inputs)
        bufs = self._buffers_for(inputs)
        # the runtime's copies themselves: CuPy's own refuse a device-to-host copy while the
        # stream is capturing, which a copy into pinned memory may be
        runtime = cp.cuda.runtime
        for a, host in zip(inputs, bufs.inputs, strict=True):
            runtime.memcpyAsync(
                host.ctypes.data, a.data.ptr, a.nbytes, runtime.memcpyDeviceToHost, stream.ptr
            )
        stream.launch_host_func(self._run, bufs)
        out = cp.empty(bufs.output.shape, dtype=self.dtype)
        back = bufs.output.ctypes.data
        runtime.memcpyAsync(out.data.ptr, back, out.nbytes, runtime.memcpyHostToDevice, stream.ptr)
        return out

    def check(self) -> None:
        """Raise what the function raised in an earlier call (once)."""
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    def _buffers_for(self, inputs: Sequence[Any]) -> _Buffers:
        key = tuple((a.shape, a.dtype.str) for a in inputs)
        bufs = self._buffers.get(key)
        if bufs is None:
            held = tuple(cupyx.empty_pinned(a.shape, dtype=a.dtype) for a in inputs)
            shape = self.output_shape(*(a.shape for a in inputs))
            bufs = self._buffers[key] = _Buffers(held, cupyx.empty_pinned(shape, self.dtype))
        return bufs

    def _run(self, bufs: _Buffers) -> None:
        try:
            result = self.fn(*bufs.inputs)
            if result is None:
                bufs.output.fill(0)
            else:
                bufs.output[...] = result
        except BaseException as failure:  # the driver's thread cannot take it: the caller will
            log.exception("a host node's function failed")
            bufs.output.fill(np.nan)
            self.failure = failure
