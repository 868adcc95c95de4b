"""Kernel traces of a decode step and a prefill chunk on the CUDA backend, recorded with
``torch.profiler`` (``ninfer-bench run --profile 1 --kernel-trace``).

The profiler's CUDA activity (CUPTI, through kineto) records every kernel the process runs,
CuPy's, cuBLAS's and Triton's alike, and the kernels inside a CUDA graph's replay where
CUPTI reports them. Each traced step runs inside a host-side range (``record_function``)
that ends after the device has drained, so a kernel belongs to the range its start falls
in. The arithmetic on the kernels is ``kernel_trace``'s; this module only runs the work and
reads the events. It never breaks the bench: without torch, a CUDA device or a profiler
that records kernels, a row says why the trace is missing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from ..arrays import sync
from ..runner import ModelRunner
from . import kernel_trace as K
from .rates import fill_random

#: the host-side ranges' names begin with this (their device-side shadows are skipped too)
WINDOW_PREFIX = "ninfer-trace:"
#: what kineto calls device work: kernels, copies, memsets
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")

Window = Callable[[str], AbstractContextManager[Any]]


def trace_rows(
    runner: ModelRunner,
    *,
    lanes: int = 0,
    context: int = 0,
    chunk: int = 0,
    steps: int = 3,
    kv_dtype: str = "float32",
) -> list[dict[str, Any]]:
    """Rows of kind ``kernel trace``: the decode step at ``lanes`` lanes after ``context``
    tokens (the median of ``steps`` traced steps; 0 lanes: none) and one prefill chunk of
    ``chunk`` tokens (0: none); or one row with ``unavailable`` saying why not."""
    try:
        reason = unavailable(runner)
        if reason:
            return [{"kind": "kernel trace", "unavailable": reason}]
        rows = _trace(runner, lanes, context, chunk, steps, kv_dtype)
    except Exception as exc:  # a trace is an extra: it never stops the bench
        return [{"kind": "kernel trace", "unavailable": f"{type(exc).__name__}: {exc}"}]
    if not any(r["kernels"] for r in rows):
        return [{"kind": "kernel trace", "unavailable": "the profiler recorded no CUDA kernels"}]
    return rows


def unavailable(runner: ModelRunner) -> str | None:
    """Why no kernel trace can be recorded here, or None."""
    if not hasattr(runner.backend.xp, "cuda"):
        return "the CPU backend runs no CUDA kernels"
    try:
        import torch
        from torch.profiler import ProfilerActivity, supported_activities
    except ImportError:
        return "torch is not installed (the trace reads CUPTI through torch.profiler)"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if ProfilerActivity.CUDA not in supported_activities():
        return "this torch build cannot trace CUDA kernels (no CUPTI)"
    return None


def _trace(
    runner: ModelRunner, lanes: int, context: int, chunk: int, steps: int, kv_dtype: str
) -> list[dict[str, Any]]:
    graphs = bool(getattr(runner.backend, "graphs", False))
    _keep_cupti_for_graphs(graphs)
    works, rows = [], []
    if lanes:
        works.append(_decode_work(runner, lanes, context, steps, kv_dtype))
    if chunk:
        works.append(_prefill_work(runner, chunk))
    windows = record(lambda window: [work(window) for work in works])
    if lanes:
        row = _decode_row(
            windows, lanes, context, steps, "CUDA graph replay" if graphs else "eager"
        )
        if graphs and row["kernels"] < len(runner.model.layers):
            # the replays' kernels were not reported: trace the same step without graphs
            row = _eager_decode_row(runner, lanes, context, steps, kv_dtype)
        rows.append(row)
    if chunk:
        rows.append(
            {"kind": "kernel trace", "of": "prefill", "tokens": chunk, "mode": "eager"}
            | K.as_row(K.summarize(windows.get("prefill", [])))
        )
    return rows


def _decode_row(
    windows: dict[str, list[K.KernelEvent]], lanes: int, context: int, steps: int, mode: str
) -> dict[str, Any]:
    traced = [windows.get(f"decode {i}", []) for i in range(steps)]
    return {
        "kind": "kernel trace",
        "of": "decode",
        "lanes": lanes,
        "context": context,
        "steps": steps,
        "mode": mode,
    } | K.as_row(K.median_step(traced))


def _eager_decode_row(
    runner: ModelRunner, lanes: int, context: int, steps: int, kv_dtype: str
) -> dict[str, Any]:
    backend = runner.backend
    backend.graphs = False  # type: ignore[attr-defined]
    try:
        work = _decode_work(ModelRunner(runner.model), lanes, context, steps, kv_dtype)
        windows = record(work)
    finally:
        backend.graphs = True  # type: ignore[attr-defined]
    mode = "eager: the profiler saw no kernels inside CUDA graph replays"
    return _decode_row(windows, lanes, context, steps, mode)


def _decode_work(
    runner: ModelRunner, lanes: int, context: int, steps: int, kv_dtype: str
) -> Callable[[Window], None]:
    """Decode steps on random K/V after ``context`` tokens (as ``rates.decode_rate``),
    warmed (compiled, captured) before the trace starts; the traced ones each in a window."""
    xp, vocab = runner.backend.xp, runner.model.config.vocab
    room = context + steps + 4
    pool = runner.new_pool(lanes=lanes, max_context=room, kv_dtype=kv_dtype)
    states = [pool.open(room) for _ in range(lanes)]
    fill_random(pool, xp, lanes * 7919 + context)
    for s in states:
        pool.advance(s, context)
    rng = np.random.default_rng(0)

    def step() -> None:
        runner.forward([rng.integers(0, vocab, 1) for _ in range(lanes)], states)

    for _ in range(3):  # the first runs eagerly, the second captures, the third replays
        step()
    sync(xp)

    def work(window: Window) -> None:
        for i in range(steps):
            with window(f"decode {i}"):
                step()
                sync(xp)

    return work


def _prefill_work(runner: ModelRunner, tokens: int) -> Callable[[Window], None]:
    """One chunk of ``tokens`` tokens into an empty sequence, run once untraced first."""
    xp = runner.backend.xp
    ids = np.random.default_rng(3).integers(0, runner.model.config.vocab, tokens)
    runner.forward([ids], [runner.new_state(tokens + 1)], last_only=True)  # compile, plan
    state = runner.new_state(tokens + 1)
    sync(xp)

    def work(window: Window) -> None:
        with window("prefill"):
            runner.forward([ids], [state], last_only=True)
            sync(xp)

    return work


def record(work: Callable[[Window], Any]) -> dict[str, list[K.KernelEvent]]:
    """The device work ``work(window)`` ran, by window label: ``work`` wraps each traced
    step in ``window(label)``."""
    from torch.profiler import ProfilerActivity, profile, record_function

    def window(label: str) -> AbstractContextManager[Any]:
        return record_function(WINDOW_PREFIX + label)

    # CPU activity: the host-side ranges are recorded with it
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        work(window)
    kernels, windows = device_events(prof.events())
    return K.split_windows(kernels, windows)


def device_events(
    events: Any,
) -> tuple[list[K.KernelEvent], list[tuple[str, float, float]]]:
    """``torch.profiler``'s function events as (kernels, windows): device work as
    (name, start_us, duration_us), the host-side ranges this module opened as
    (label, start_us, end_us); both on the profiler's one timeline."""
    from torch.autograd import DeviceType

    kernels, windows = [], []
    for e in events:
        start, end = e.time_range.start, e.time_range.end
        if e.name.startswith(WINDOW_PREFIX):
            if e.device_type == DeviceType.CPU:
                windows.append((e.name[len(WINDOW_PREFIX) :], start, end))
            continue
        kind = getattr(e, "activity_type", None)  # recent torch says what each event is
        if e.device_type == DeviceType.CUDA and (kind is None or kind.lower() in DEVICE_WORK):
            kernels.append((e.name, start, end - start))
    return kernels, windows


def _keep_cupti_for_graphs(graphs: bool) -> None:
    """As ``torch.profiler`` does for graphs it knows of: before CUDA 12.6, re-initialising
    CUPTI after a session's teardown crashes a process holding CUDA graphs (the decode
    steps' are CuPy's, which torch does not see), so CUPTI stays set up after a trace."""
    import torch

    version = tuple(int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
    if graphs and version < (12, 6):
        os.environ.setdefault("DISABLE_CUPTI_LAZY_REINIT", "1")
        os.environ.setdefault("TEARDOWN_CUPTI", "0")
