"""Small host arrays (a launch's tables: copy ranges, segments) to the device without the
host waiting for it.

A copy from pageable host memory makes the host wait until the stream has run everything
queued before it (the driver stages the bytes once the stream is idle), so a table uploaded
between a layer's launches drains the device queue and the host's lead over it: one launch's
table in a 48-layer step is 48 such waits. ``upload`` stages the bytes in pinned memory and
queues the copy on the current stream; the host goes on at once, and the staging is kept
until the copy is done (an event per upload, queried, never waited on)."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

__all__ = ["upload"]

#: (event after the copy, its pinned staging) of copies that may still be running, oldest first
_PENDING: deque[tuple[Any, np.ndarray]] = deque()


def upload(host: np.ndarray) -> Any:
    """A device copy of ``host`` in the current stream's order, the host not waiting (not
    under a graph capture: a captured copy would read the staging at every replay)."""
    import cupy as cp
    import cupyx

    stream = cp.cuda.get_current_stream()
    if stream.is_capturing():
        raise RuntimeError("upload: a copy from host memory cannot be captured")
    while _PENDING and _PENDING[0][0].done:  # copies done: their staging may be reused
        _PENDING.popleft()
    staged = cupyx.empty_pinned(host.shape, host.dtype)
    staged[...] = host
    out = cp.empty(host.shape, host.dtype)
    out.data.copy_from_host_async(staged.ctypes.data, staged.nbytes, stream)
    _PENDING.append((stream.record(), staged))
    return out
