"""A model split over ranks (``parallel``), run by one scheduler: rank 0 holds the engine,
and its runner's and pool's calls are made on every rank (``parallel.mirror``). The ranks are
threads of this process on the CPU backend (one process per GPU over NCCL is not built yet)."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

from .models import Model, load_model
from .parallel import Leader, ThreadGroup, follow
from .runner import ModelRunner
from .state import Checkpoint, ContextPool, HostCopy, SequenceState

#: what the scheduler gets back from the runner and the pool and passes back later
KEPT = (SequenceState, Checkpoint, HostCopy, ContextPool)


def parallel_runner(artifact: Any, backend: str, world: int) -> tuple[Model, Any, Leader]:
    """Rank 0's model, a runner whose calls ranks 1 .. world - 1 make too (each on its share
    of the model, loaded from the same artifact in its own thread), and the leader (``stop``
    ends the other ranks)."""
    group = ThreadGroup(world)
    inboxes: list[queue.Queue] = [queue.Queue() for _ in range(world - 1)]
    for rank, inbox in enumerate(inboxes, start=1):
        threading.Thread(
            target=_follower,
            args=(artifact.path, backend, group, rank, inbox),
            name=f"ninfer-rank-{rank}",
            daemon=True,
        ).start()
    try:
        model = load_model(artifact, backend, collective=group.rank(0))
    except BaseException:
        group.abort("rank 0 failed to load")
        for inbox in inboxes:
            inbox.put(None)
        raise
    leader = Leader(inboxes, KEPT, wrapped=(ContextPool,))
    return model, leader.wrap(ModelRunner(model)), leader


def _follower(path: Path, backend: str, group: ThreadGroup, rank: int, inbox: queue.Queue) -> None:
    try:
        runner = ModelRunner(load_model(path, backend, collective=group.rank(rank)))
    except BaseException as exc:
        group.abort(f"rank {rank} failed to load: {exc}")
        return
    follow(inbox, runner, KEPT, lambda exc: group.abort(f"rank {rank} failed: {exc}"))
