"""Decode steps captured once as CUDA graphs and replayed every token.

A decode step launches a few hundred small kernels; replaying them as one graph removes the
Python and launch overhead between them. What makes a step capturable is the model's job (no
host synchronisation, lanes addressed by device index arrays); this module owns the rest:

* the step's inputs (token ids, slots, positions, ...: int32 arrays of fixed shapes) live in
  static device buffers that the host overwrites before each replay;
* everything the step allocates comes from a memory pool of its own, which is never handed
  to anything else, so the addresses baked into the graph stay valid for its lifetime;
* the outputs are the arrays the capture produced, copied out after each replay;
* the backend's epoch (``forget_graphs``: weights a step read were replaced, as expert offload
  placing its experts again) is checked before each replay: a step captured at another runs
  eagerly once and is captured again; a host node's failure in an earlier replay is raised
  there too (``host_node.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import cupy as cp
import numpy as np

from .compile import load_capture_only

log = logging.getLogger("ninfer.cuda")


class GraphStep:
    """``fn(*inputs)`` on int32 inputs of fixed ``shapes``, captured on the second call."""

    def __init__(
        self,
        fn: Callable[..., tuple[Any, ...]],
        shapes: Sequence[tuple[int, ...]],
        stream: Any,
        pool: Any,
        epoch: Callable[[], int | None] = lambda: 0,
    ):
        """``epoch``: the backend's count of replaced weights (``forget_graphs``); a step
        captured at another count runs eagerly once more and is captured again; None: the
        backend's steps run eagerly from now on (``decode_eagerly``)."""
        self.fn, self.shapes, self.stream, self.pool = fn, tuple(shapes), stream, pool
        self.epoch = epoch
        self.inputs = [cp.zeros(shape, dtype=cp.int32) for shape in self.shapes]
        self.graph: Any = None
        self._warm_at: int | None = None  # the epoch of the last eager run
        self.outputs: tuple[Any, ...] = ()

    def __call__(self, *host: np.ndarray) -> tuple[Any, ...]:
        with self.stream:
            for buf, values in zip(self.inputs, host, strict=True):
                buf.set(np.ascontiguousarray(values, dtype=np.int32), stream=self.stream)
            epoch = self.epoch()
            if epoch is None or self._warm_at != epoch:
                # the first call, and the first after weights it reads were replaced, runs
                # eagerly: kernels compile, libraries and tables set up outside any capture
                # (a step updates recurrent states, so it must run exactly once)
                self._warm_at, self.graph, self.outputs = epoch, None, ()
                return tuple(out.copy() for out in self._run())
            if self.graph is None:
                self._capture()
            self.graph.launch(self.stream)
            return tuple(out.copy() for out in self.outputs)

    def _run(self) -> tuple[Any, ...]:
        """``fn`` on the input buffers; a step that only updates state returns None: ()."""
        outputs = self.fn(*self.inputs)
        return () if outputs is None else tuple(outputs)

    def _capture(self) -> None:
        load_capture_only()  # kernels the eager run did not launch, loaded outside the capture
        self.stream.synchronize()
        with cp.cuda.using_allocator(self.pool.malloc):
            self.stream.begin_capture()
            try:
                self.outputs = self._run()
            finally:
                self.graph = self.stream.end_capture()
        log.info("captured a step with inputs %s", self.shapes)
