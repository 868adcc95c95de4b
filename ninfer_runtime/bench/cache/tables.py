"""The markdown of a ``ninfer-bench cache`` run: its tables (printed and recorded alike) and
its ``--record`` section."""

from __future__ import annotations

from typing import Any

from ...sizes import format_size
from ..record import RunContext


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The tables of a run's ``--json`` rows, in markdown (printed and recorded alike)."""
    lines: list[str] = []
    for r in rows:
        if r["kind"] == "prefix ttft":
            lines += [
                f"Time to first token of a {r['prefix']} + {r['suffix']}-token prompt, one "
                f"lane: cold, and resumed from its cached {r['prefix']}-token prefix (median "
                f"of {r['cached_requests']}, fresh suffixes); floor: FLOPs of the tokens "
                "prefilled at the measured matmul rate.",
                "",
                "| prefix | suffix | cold ms | floor ms | cached ms | floor ms | cached tokens "
                "| cached / cold |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|",
                f"| {r['prefix']} | {r['suffix']} | {r['cold_ms']:.1f} "
                f"| {r['cold_floor_ms']:.1f} | {r['cached_ms']:.1f} "
                f"| {r['cached_floor_ms']:.2f} | {r['cached_tokens']} "
                f"| {100 * r['ratio']:.1f}% |",
                "",
            ]
        elif r["kind"] == "pressure":
            matches = {None: "not checked", True: "yes", False: "NO"}[r["matches"]]
            lines += [
                f"Memory pressure: {r['requests']} requests at once of {r['context']} tokens "
                f"({r['context'] - r['max_tokens']} prompt + {r['max_tokens']} greedy), pool "
                f"sized for {r['full_requests']} at full length ({r['pool_pages']} pages of "
                f"the {r['requests'] * r['pages_per_request']} all would take, "
                f"{format_size(r['capacity_bytes'])} with the lanes' state slots); host "
                f"memory for preempted lanes: {r.get('host_context_capacity', '0')}.",
                "",
                "| completed | wall s | generated tok/s | most running | preemptions "
                "| replayed tokens | outputs as unconstrained |",
                "|---:|---:|---:|---:|---:|---:|:---|",
                f"| {r['completed']} / {r['requests']} | {r['wall_s']:.2f} "
                f"| {r['tokens_per_s']:.1f} | {r['most_running']} | {r['preemptions']} "
                f"| {r['replayed_tokens']} | {matches} |",
                "",
            ]
    return lines


def markdown(rows: list[dict[str, Any]], ctx: RunContext) -> str:
    """One ``--record`` section for a run's rows."""
    return "\n".join(
        [
            f"### `ninfer-bench cache` {ctx.artifact}, {ctx.date}",
            "",
            f"{ctx.device}, commit {ctx.commit}, K/V {ctx.kv_dtype}, "
            f"device-to-device copy {ctx.copy_gbps:.0f} GB/s (read + write).",
            "",
            *table_lines(rows),
        ]
    )
