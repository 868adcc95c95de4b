"""What a traced step's kernels say about its time: how many ran, how long they ran, and how
long the device sat idle between them.

The events are ``(name, start_us, duration_us)`` tuples of device work (kernels, copies,
memsets) on one timeline, as a profiler recorded them (``kernel_profiler`` reads them from
``torch.profiler``); this module is the arithmetic alone, so it runs without a GPU.

* ``span``: first kernel's start to last kernel's end: the step as the device saw it.
* ``busy``: the union of the kernels' intervals (overlapping kernels, on several streams,
  count once); ``idle`` = span - busy: time inside the step with no kernel running, which
  is what launches and host work between kernels cost once the kernels are fast.
* ``kernel time``: the plain sum of durations (above ``busy`` when kernels overlap).
* gaps: the idle stretches between busy ones; those over ``gap_us`` are counted, the
  largest listed, and the largest one's neighbours named (the work that ended last before
  it and the work that started first after it): where the host held the device up.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: a kernel as recorded: name, start and duration in microseconds
KernelEvent = tuple[str, float, float]

#: gaps shorter than this (µs) are a launch's ordinary latency inside a graph, not counted
GAP_US = 5.0
#: characters a shortened kernel name keeps
NAME_CHARS = 48


@dataclass(frozen=True)
class KernelTime:
    """One kernel name's share of a step: how often it ran and its summed duration."""

    name: str
    count: int
    ms: float


@dataclass(frozen=True)
class TraceSummary:
    """One step's kernels, summed (see the module docstring for each figure)."""

    kernels: int
    kernel_ms: float
    span_ms: float
    busy_ms: float
    idle_ms: float
    gap_us: float
    gaps_over: int
    largest_gaps_us: tuple[float, ...]
    top: tuple[KernelTime, ...]
    #: (before, after): the short names around the largest gap (empty: no gap)
    largest_gap_between: tuple[str, ...] = ()

    @property
    def idle_percent(self) -> float:
        return 100 * self.idle_ms / self.span_ms if self.span_ms else 0.0


def short_name(name: str) -> str:
    """A kernel's name without ``void`` and its parameter list, cut to ``NAME_CHARS``
    (template arguments stay where they fit: a library's GEMM kernels differ only there)."""
    text = name.strip().removeprefix("void ")
    depth = 0
    for i, ch in enumerate(text):
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "(" and depth == 0 and i > 0:
            text = text[:i].rstrip()
            break
    text = text or name.strip()
    return text if len(text) <= NAME_CHARS else text[: NAME_CHARS - 1] + "…"


def busy_intervals(events: Iterable[KernelEvent]) -> list[tuple[float, float]]:
    """The union of the events' intervals as disjoint (start, end) pairs in time order;
    back-to-back or overlapping kernels merge into one."""
    merged: list[list[float]] = []
    for _, start, duration in sorted(events, key=lambda e: e[1]):
        end = start + max(duration, 0.0)
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def summarize(
    events: Sequence[KernelEvent], *, gap_us: float = GAP_US, top: int = 10, largest: int = 3
) -> TraceSummary:
    """The figures of one step's ``events`` (an empty list gives zeros)."""
    busy = busy_intervals(events)
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(busy)]
    span = busy[-1][1] - busy[0][0] if busy else 0.0
    covered = sum(b - a for a, b in busy)
    by_name: dict[str, list[float]] = {}
    for name, _, duration in events:
        tally = by_name.setdefault(short_name(name), [0, 0.0])
        tally[0] += 1
        tally[1] += duration
    ranked = sorted(by_name.items(), key=lambda kv: (-kv[1][1], kv[0]))[:top]
    between: tuple[str, ...] = ()
    if gaps:
        i = max(range(len(gaps)), key=gaps.__getitem__)
        gap_start, gap_end = busy[i][1], busy[i + 1][0]
        ended = [e for e in events if e[1] + max(e[2], 0.0) <= gap_start]
        before = max(ended, key=lambda e: e[1] + max(e[2], 0.0))
        after = min((e for e in events if e[1] >= gap_end), key=lambda e: e[1])
        between = (short_name(before[0]), short_name(after[0]))
    return TraceSummary(
        kernels=len(events),
        kernel_ms=sum(e[2] for e in events) / 1e3,
        span_ms=span / 1e3,
        busy_ms=covered / 1e3,
        idle_ms=(span - covered) / 1e3,
        gap_us=gap_us,
        gaps_over=sum(g > gap_us for g in gaps),
        largest_gaps_us=tuple(sorted(gaps, reverse=True)[:largest]),
        top=tuple(KernelTime(n, int(c), t / 1e3) for n, (c, t) in ranked),
        largest_gap_between=between,
    )


def split_windows(
    events: Sequence[KernelEvent], windows: Sequence[tuple[str, float, float]]
) -> dict[str, list[KernelEvent]]:
    """``events`` by the window (label, start_us, end_us) their start falls in: a step
    traced inside a host-side range that ends only once the device has finished has all
    its kernels start inside that range. Events outside every window are dropped."""
    out: dict[str, list[KernelEvent]] = {label: [] for label, _, _ in windows}
    ordered = sorted(windows, key=lambda w: w[1])
    for event in events:
        for label, start, end in ordered:
            if start <= event[1] <= end:
                out[label].append(event)
                break
    return out


def median_step(steps: Sequence[Sequence[KernelEvent]]) -> TraceSummary:
    """The summary of the step of median span among ``steps`` (each one step's events):
    a real step, not an average of several."""
    summaries = sorted((summarize(s) for s in steps), key=lambda s: s.span_ms)
    return summaries[(len(summaries) - 1) // 2]


def as_row(summary: TraceSummary) -> dict[str, Any]:
    """The ``--json`` figures of a summary (ms, µs as named)."""
    return {
        "kernels": summary.kernels,
        "kernel_ms": summary.kernel_ms,
        "span_ms": summary.span_ms,
        "busy_ms": summary.busy_ms,
        "idle_ms": summary.idle_ms,
        "idle_percent": summary.idle_percent,
        "gap_us": summary.gap_us,
        "gaps_over": summary.gaps_over,
        "largest_gaps_us": list(summary.largest_gaps_us),
        "largest_gap_between": list(summary.largest_gap_between),
        "top": [{"name": k.name, "count": k.count, "ms": k.ms} for k in summary.top],
    }


def _gaps_text(gaps_over: int, gap_us: float, largest: Sequence[float]) -> str:
    text = f"{gaps_over} gaps > {gap_us:g} µs"
    if largest:
        text += " (largest " + ", ".join(f"{g:.1f}" for g in largest) + " µs)"
    return text


def title(row: dict[str, Any]) -> str:
    """What a trace row traced: a decode step (its lanes and context) or a prefill chunk,
    replayed as a CUDA graph or run eagerly."""
    if row["of"] == "decode":
        what = f"decode step at {row['lanes']} lane(s), context {row['context']}"
    else:
        what = f"prefill chunk of {row['tokens']} tokens"
    steps = f"; median of {row['steps']} steps" if row.get("steps", 1) > 1 else ""
    return f"kernel trace, {what} ({row['mode']}{steps})"


def unavailable_line(reason: str) -> str:
    return f"kernel trace unavailable: {reason}"


def lines(row: dict[str, Any]) -> list[str]:
    """The printed table of a trace row (``as_row`` figures and what ``title`` reads): the
    step's totals, then its top kernels by time; or the one line saying why there is none."""
    if "unavailable" in row:
        return [unavailable_line(row["unavailable"])]
    largest = ", ".join(f"{g:.1f}" for g in row["largest_gaps_us"]) or "-"
    gaps = f"gaps > {row['gap_us']:g} µs"
    out = [
        title(row) + ":",
        f"  {'kernels':>7} {'kernel ms':>9} {'span ms':>8} {'idle ms':>8} {'idle %':>6} "
        f"{gaps:>12}  largest gaps (µs)",
        f"  {row['kernels']:>7} {row['kernel_ms']:>9.3f} {row['span_ms']:>8.3f} "
        f"{row['idle_ms']:>8.3f} {row['idle_percent']:>5.1f}% {row['gaps_over']:>12}  {largest}",
        f"  {'top kernels by time':<{NAME_CHARS}} {'count':>6} {'ms':>8} {'% span':>7}",
    ]
    between = row.get("largest_gap_between") or ()
    if between:
        out.append(f"  the largest gap: after {between[0]}, before {between[1]}")
    span = row["span_ms"] or 1.0
    out += [
        f"  {k['name']:<{NAME_CHARS}} {k['count']:>6} {k['ms']:>8.3f} {100 * k['ms'] / span:>6.1f}%"
        for k in row["top"]
    ]
    return out


def record_line(row: dict[str, Any], top: int = 5) -> str:
    """One markdown line for ``--record``: the totals and the first ``top`` kernels; or why
    there is no trace."""
    if "unavailable" in row:
        return _sentence(unavailable_line(row["unavailable"])) + "."
    kernels = ", ".join(f"`{k['name']}` {k['ms']:.3f} ms ×{k['count']}" for k in row["top"][:top])
    return (
        f"{_sentence(title(row))}: {row['kernels']} kernels, {row['kernel_ms']:.3f} ms of "
        f"kernels over a {row['span_ms']:.3f} ms span, {row['idle_ms']:.3f} ms idle "
        f"({row['idle_percent']:.1f}%), "
        + _gaps_text(row["gaps_over"], row["gap_us"], row["largest_gaps_us"])
        + _between_text(row.get("largest_gap_between") or ())
        + (f"; top: {kernels}." if kernels else ".")
    )


def _between_text(between: Sequence[str]) -> str:
    return f", the largest after `{between[0]}` and before `{between[1]}`" if between else ""


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]
