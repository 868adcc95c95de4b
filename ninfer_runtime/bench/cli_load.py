"""Loading the model ``ninfer-bench run`` times, its routed experts split by ``--vram-budget``
(for a reduced artifact, the budget of the whole model scaled to the layers it keeps)."""

from __future__ import annotations

from typing import Any

import click


def load_bench_model(
    opened: Any, backend: str, vram_budget: str | None, reduced: Any, chunk: int
) -> tuple[Any, Any]:
    """The model and its expert offload (None without ``vram_budget``): its routed experts
    split by ``vram_budget`` (scaled to a reduced artifact), the backend's workspace planned
    for prefill chunks of ``chunk`` tokens."""
    from ..expert_offload import ExpertOffload
    from ..models import load_model

    if vram_budget is None:
        return load_model(opened, backend), None
    budget, note = _scaled_budget(opened, vram_budget, reduced)
    if note:  # (the plan's summary below names the budget itself)
        click.echo(note)
    offload = ExpertOffload.for_budget(budget, backend, prefill_rows=chunk)
    options = {"ple_rows": "streamed"} if _has_ple(opened) else None  # as the whole model's
    model = load_model(opened, backend, expert_offload=offload, options=options)
    assert offload is not None and offload.plan is not None
    click.echo(offload.plan.summary())
    return model, offload


def _has_ple(opened: Any) -> bool:
    return bool(opened.components["text"].config.get("ple_layer_ids"))


def _scaled_budget(opened: Any, given: str, reduced: Any) -> tuple[int, str]:
    """The budget in bytes for this artifact, and for a reduced one a line saying how it was
    scaled (empty otherwise). A reduced artifact gets its own weights other than routed
    experts (n-gram tables aside: they stay on the host; the MTP block and proposal head
    included, as the text model loads them) plus the share of its experts the whole model
    would keep within ``given``."""
    from ..capacity import parse_size
    from ..expert_offload.plan import WeightSizes, stored_bytes
    from ..sizes import format_size

    whole_budget = parse_size(given, "vram budget")
    assert whole_budget is not None
    if reduced is None:
        return whole_budget, ""
    names = [n for n in opened.bindings if not n.startswith("vision/") and "ngram_table" not in n]
    sizes = WeightSizes.measure(opened, names)
    whole = reduced["whole_bytes"]
    tables = sum(stored_bytes(opened, n) for n in opened.bindings if "ngram_table" in n)
    tables /= reduced.get("ple_rows_scale", 1)
    whole_other = whole["weights"] + whole.get("others", 0) - whole["experts"] - tables
    share = min(1.0, max(0.0, (whole_budget - whole_other) / max(whole["experts"], 1)))
    budget = int(sizes.other + share * sizes.expert_total)
    return budget, (
        f"--vram-budget {format_size(whole_budget)} for the whole model keeps "
        f"{100 * share:.1f}% of its routed experts in device memory; this artifact gets "
        f"{format_size(budget)}, the same share of its own"
    )
