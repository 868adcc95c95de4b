"""Loading the model ``ninfer-bench run`` times, its routed experts split by ``--vram-budget``
(for a reduced artifact, the budget of the whole model scaled to the layers it keeps)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..cli_options import (
    EXPERT_STREAM_DECODE,
    EXPERT_STREAM_DECODE_HELP,
    PLE_ROWS_CHOICES,
    model_options,
)

_OPTIONS = (
    click.option(
        "--vram-budget",
        help="device memory for the weights, e.g. 139GiB (one H200): routed experts beyond it "
        "are computed from host memory (CPU backend). For an artifact of fewer layers, the "
        "budget of the whole model: the same share of experts is kept in host memory",
    ),
    click.option(
        "--ple-rows",
        type=click.Choice(PLE_ROWS_CHOICES),
        help="Qwen4Exp's PLE n-gram tables: resident (loaded whole) or streamed (rows read "
        "from the artifact as steps need them)  [default: streamed with --vram-budget, as the "
        "whole model's tables would be; else the model's auto]",
    ),
    click.option(
        "--expert-stream-decode",
        type=click.Choice(EXPERT_STREAM_DECODE),
        help=EXPERT_STREAM_DECODE_HELP,
    ),
)


def load_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--vram-budget``, ``--ple-rows`` and ``--expert-stream-decode`` on ``command`` (as
    ``vram_budget``, ``ple_rows`` and ``expert_stream_decode``)."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def load_bench_model(
    opened: Any,
    backend: str,
    vram_budget: str | None,
    reduced: Any,
    chunk: int,
    ple_rows: str | None = None,
    stream_decode: str | None = None,
) -> tuple[Any, Any]:
    """The model and its expert offload (None without ``vram_budget``): its routed experts
    split by ``vram_budget`` (scaled to a reduced artifact), the backend's workspace planned
    for prefill chunks of ``chunk`` tokens; ``ple_rows``: where PLE's n-gram tables are read
    from (None: streamed under a budget, else the model's default); ``stream_decode``:
    which decode steps stream host experts (``--expert-stream-decode``)."""
    from ..backends import get_backend
    from ..expert_offload import ExpertOffload
    from ..models import load_model

    if ple_rows is None and vram_budget is not None and _has_ple(opened):
        ple_rows = "streamed"  # as the whole model's tables would be
    options = model_options(ple_rows)
    if vram_budget is None:
        return load_model(opened, backend, options=options), None
    be = get_backend(backend)  # one instance: the budget's scaling asks its workspace
    budget, share, note = _scaled_budget(opened, vram_budget, reduced, be, chunk)
    if note:  # (the plan's summary below names the budget itself)
        click.echo(note)
    offload = ExpertOffload.for_budget(
        budget, be, prefill_rows=chunk, stream_decode=stream_decode, resident_share=share
    )
    model = load_model(opened, be, expert_offload=offload, options=options)
    assert offload is not None and offload.plan is not None
    click.echo(offload.plan.summary())
    return model, offload


def _has_ple(opened: Any) -> bool:
    return bool(opened.components["text"].config.get("ple_layer_ids"))


def _scaled_budget(
    opened: Any, given: str, reduced: Any, backend: Any, chunk: int
) -> tuple[int, float | None, str]:
    """The budget in bytes for this artifact, the most of its routed experts' bytes it keeps
    in device memory as a share (None: what the budget holds), and for a reduced artifact a
    line saying how it was scaled (empty otherwise). A reduced artifact gets its own weights
    other than routed experts (n-gram tables aside: they stay on the host; the MTP block and
    proposal head included, as the text model loads them), the device bytes a plan sets
    beside them (``_set_aside``) and the share of its experts the whole model would keep
    within ``given`` beside the same; and that share as its most: its few layers' experts
    would otherwise all fit beside the workspace of captured decode steps, which is smaller
    than the prefill windows' room a plan with host experts sets aside."""
    from ..capacity import parse_size
    from ..expert_offload.plan import WeightSizes, stored_bytes
    from ..sizes import format_size

    whole_budget = parse_size(given, "vram budget")
    assert whole_budget is not None
    if reduced is None:
        return whole_budget, None, ""
    names = [n for n in opened.bindings if not n.startswith("vision/") and "ngram_table" not in n]
    sizes = WeightSizes.measure(opened, names)
    whole = reduced["whole_bytes"]
    tables = sum(stored_bytes(opened, n) for n in opened.bindings if "ngram_table" in n)
    tables /= reduced.get("ple_rows_scale", 1)
    whole_other = whole["weights"] + whole.get("others", 0) - whole["experts"] - tables

    def aside(budget: int) -> int:
        return _set_aside(opened, backend, chunk, sizes.experts, budget)

    room = whole_budget - whole_other - aside(whole_budget)
    share = min(1.0, max(0.0, room / max(whole["experts"], 1)))
    if share == 1:  # every expert fits: the whole model's budget holds this artifact too
        note = (
            f"--vram-budget {format_size(whole_budget)} keeps every routed expert of the whole "
            "model in device memory, and of this artifact too"
        )
        return whole_budget, None, note
    budget = int(sizes.other + share * sizes.expert_total)
    for _ in range(8):  # the window's room grows with the budget, by 1/8 of it at most
        budget = int(sizes.other + aside(budget) + share * sizes.expert_total)
    note = (
        f"--vram-budget {format_size(whole_budget)} for the whole model keeps "
        f"{100 * share:.1f}% of its routed experts in device memory beside its workspace; "
        f"this artifact gets {format_size(budget)}, the same share of its own beside the same"
    )
    return budget, share, note


def _set_aside(opened: Any, backend: Any, chunk: int, experts: Any, budget: int) -> int:
    """The device bytes a budget's plan sets beside the weights when experts stay in host
    memory (``ExpertOffload.plan_load``): the backend's workspace for prefill calls of
    ``STREAM_CHUNK`` rows (or the engine's larger ``chunk``) and the prefill window's room
    (``ExpertStream.device_room``: on a backend that prefetches, a GPU, two windows). Per-layer
    shapes are the whole model's in a reduced artifact, so the same holds for both at their
    budgets."""
    from ..expert_offload.plan import backend_workspace
    from ..expert_offload.stream_window import STREAM_CHUNK, ExpertStream

    graphs = getattr(backend, "graphs", False)
    if graphs:  # as planned: with experts on the host, decode steps run eagerly
        backend.graphs = False
    try:
        workspace = backend_workspace(backend, opened, max(chunk, STREAM_CHUNK))
    finally:
        if graphs:
            backend.graphs = graphs
    window = ExpertStream()
    window.sizes = experts
    return workspace + window.device_room(backend, budget)
