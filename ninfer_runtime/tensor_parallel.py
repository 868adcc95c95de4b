"""A model split over ranks (``parallel``), run by one scheduler: rank 0 (this process) holds
the engine, and its runner's and pool's calls are made on every rank (``parallel.mirror``),
one process a rank, joined by pipes (``parallel.processes``). On the CPU backend the pipes
also carry the collectives; on the CUDA backend rank r runs on GPU r and NCCL carries them
(``parallel.nccl``)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

from .errors import EngineError
from .models import Model, load_model
from .parallel import Leader, follow
from .parallel.processes import Inbox, Outbox, PipeRank
from .runner import ModelRunner
from .state import Checkpoint, ContextPool, HostCopy, SequenceState

#: what the scheduler gets back from the runner and the pool and passes back later
KEPT = (SequenceState, Checkpoint, HostCopy, ContextPool)
#: how long the end of an engine waits for each other rank's process to finish
STOP_SECONDS = 10.0


def parallel_runner(
    artifact: Any, backend: str, world: int, expert_parallel: bool = False
) -> tuple[Model, Any, Callable[[], None]]:
    """Rank 0's model, a runner whose calls ranks 1 .. world - 1 make too (each a process
    holding its share of the model, loaded from the same artifact; with ``expert_parallel``
    each routed expert whole on one rank), and what ends the other ranks (their loops, then
    their processes)."""
    if backend == "cuda":
        from .parallel.nccl import unavailable_reason

        reason = unavailable_reason(world)
        if reason is not None:
            raise EngineError(f"--tensor-parallel {world}: {reason}")
    context = multiprocessing.get_context("spawn")
    plans, links, processes = [], [], []
    for rank in range(1, world):
        plan, plan_end = context.Pipe()
        link, link_end = context.Pipe()
        process = context.Process(
            target=_rank_process,
            args=(str(artifact.path), backend, rank, world, expert_parallel, plan_end, link_end),
            name=f"ninfer-rank-{rank}",
            daemon=True,
        )
        process.start()
        processes.append(process)
        plan_end.close()  # the child's ends: its exit then closes the pipes
        link_end.close()
        plans.append(plan)
        links.append(link)
    collective: Any = PipeRank(0, world, links)
    try:
        collective = _on_device(backend, collective)
        model = load_model(artifact, backend, collective, expert_parallel)
    except BaseException as exc:
        collective.fail(f"could not load: {exc}")
        raise
    leader = Leader([Outbox(p) for p in plans], KEPT, wrapped=(ContextPool,))

    def stop() -> None:
        leader.stop()
        for process in processes:  # let each end by itself, before the interpreter exits
            process.join(STOP_SECONDS)

    return model, leader.wrap(ModelRunner(model)), stop


def _rank_process(
    path: str, backend: str, rank: int, world: int, expert_parallel: bool, plan: Any, link: Any
) -> None:
    collective: Any = PipeRank(rank, world, [link])
    try:
        collective = _on_device(backend, collective)
        runner = ModelRunner(load_model(path, backend, collective, expert_parallel))
    except BaseException as exc:
        collective.fail(f"could not load: {exc}")
        return
    follow(Inbox(plan), runner, KEPT, lambda exc: collective.fail(f"{type(exc).__name__}: {exc}"))


def _on_device(backend: str, pipes: PipeRank) -> Any:
    """The rank's collective: on the CUDA backend its GPU (rank r: device r) made current and
    NCCL joined over it; otherwise the pipes themselves."""
    if backend != "cuda":
        return pipes
    import cupy as cp

    from .parallel.nccl import NcclRank

    cp.cuda.Device(pipes.rank).use()
    return NcclRank(pipes)
