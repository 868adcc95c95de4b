"""Collectives between GPUs by NCCL (through CuPy's bindings), one process a GPU.

The ranks' processes are already joined by pipes (``processes.PipeRank``): rank 0 makes
NCCL's unique id and sends it down them, then each rank joins the communicator on its own
GPU. The collectives run on the current CUDA stream with nothing read back, so a decode step
captured as a CUDA graph holds them; the pipes still carry a failing rank's message.

A collective whose peer has died would wait for ever, so a watchdog thread listens on the
pipes, which carry nothing else once the communicator exists: a rank's failure message, or
its end of a pipe closing with its process, aborts the communicator (the waiting collective
then fails instead of hanging) and every later collective raises ``CollectiveError`` naming
the rank.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .collective import CollectiveError
from .processes import PipeRank

Array = Any

__all__ = ["NcclRank", "unavailable_reason"]


def unavailable_reason(world: int) -> str | None:
    """Why ``world`` ranks cannot run on this machine's GPUs by NCCL, or None."""
    try:
        import cupy as cp
        from cupy.cuda import nccl
    except ImportError as exc:
        return f"tensor parallelism on the cuda backend needs CuPy with NCCL ({exc})"
    if not getattr(nccl, "available", False):
        return "tensor parallelism on the cuda backend needs NCCL, which CuPy cannot load here"
    try:
        devices = cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError as exc:
        return f"tensor parallelism on the cuda backend needs NVIDIA GPUs ({exc})"
    if devices < world:
        return f"{world} ranks need {world} GPUs, this machine has {devices}"
    return None


class NcclRank:
    """One GPU's rank (the current device) in a group of ``pipes.world``."""

    def __init__(self, pipes: PipeRank):
        import cupy as cp
        from cupy.cuda import nccl

        self.rank, self.world, self._pipes = pipes.rank, pipes.world, pipes
        self._nccl, self._cp = nccl, cp
        self._types = {np.dtype(np.float32): nccl.NCCL_FLOAT32}
        uid = pipes.share(nccl.get_unique_id() if self.rank == 0 else None)
        try:
            self._comm = nccl.NcclCommunicator(self.world, uid, self.rank)
        except nccl.NcclError as exc:
            raise CollectiveError(f"rank {self.rank} of {self.world}: NCCL: {exc}") from None
        self._broken: str | None = None
        threading.Thread(target=self._watch, name="ninfer-nccl-watchdog", daemon=True).start()

    def all_reduce(self, x: Array) -> Array:
        x, kind = self._operand(x)
        out = self._cp.empty_like(x)
        self._call(
            self._comm.allReduce, x.data.ptr, out.data.ptr, x.size, kind, self._nccl.NCCL_SUM
        )
        return out

    def all_gather(self, x: Array) -> Array:
        x, kind = self._operand(x)
        parts = self._cp.empty((self.world, *x.shape), dtype=x.dtype)
        self._call(self._comm.allGather, x.data.ptr, parts.data.ptr, x.size, kind)
        return self._cp.concatenate(list(parts), axis=-1)

    def fail(self, message: str) -> None:
        self._pipes.fail(message)

    def _operand(self, x: Array) -> tuple[Array, int]:
        x = self._cp.ascontiguousarray(x)
        kind = self._types.get(x.dtype)
        if kind is None:
            raise CollectiveError(f"NCCL collective of {x.dtype}: expected float32")
        return x, kind

    def _call(self, op: Any, *args: Any) -> None:
        if self._broken is not None:
            raise CollectiveError(self._broken)
        try:
            op(*args, self._cp.cuda.get_current_stream().ptr)
        except self._nccl.NcclError as exc:
            raise CollectiveError(
                self._broken or f"rank {self.rank} of {self.world}: NCCL: {exc}"
            ) from None

    def _watch(self) -> None:
        self._broken = self._pipes.wait_for_failure()
        self._comm.abort()
