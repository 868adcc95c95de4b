"""The figures as text: ``vllm bench serve``'s block per level, the table across levels, the
markdown block docs/performance.md takes, and the agent workload's tables."""

from __future__ import annotations

import math


def shown(value: float, spec: str = ".2f") -> str:
    return "n/a" if math.isnan(value) else format(value, spec)


def ttft_source(s: dict[str, float], engine: bool = False) -> str:
    """Who measured the TTFT figures, in words."""
    if engine:
        return "engine (first token event)"
    if s["ttft_from_server"] == 0:
        return "client (first streamed token)"
    if s["ttft_from_server"] == s["ok"]:
        return "server (no text streamed)"
    return f"server for {s['ttft_from_server']:.0f} of {s['ok']:.0f} (no text streamed)"


def vllm_block(title: str, s: dict[str, float], engine: bool = False) -> str:
    """The per-level summary in ``vllm bench serve``'s layout."""
    rows = [
        ("Successful requests:", f"{s['ok']:.0f}"),
        ("Failed requests:", f"{s['failed']:.0f}"),
        ("Benchmark duration (s):", f"{s['duration_s']:.2f}"),
        ("Total input tokens:", f"{s['input_tokens']:.0f}"),
        ("Total generated tokens:", f"{s['output_tokens']:.0f}"),
        ("Request throughput (req/s):", f"{s['req_s']:.2f}"),
        ("Output token throughput (tok/s):", f"{s['out_tok_s']:.2f}"),
        ("Mean TTFT (ms):", shown(s["ttft_mean"])),
        ("Median TTFT (ms):", shown(s["ttft_p50"])),
        ("P99 TTFT (ms):", shown(s["ttft_p99"])),
        *(
            []
            if engine
            else [
                ("Mean TTFT in the server (ms):", shown(s["server_ttft_mean"])),
                ("Mean prefill in the server (ms):", shown(s["server_prefill_mean"])),
            ]
        ),
        ("Mean TPOT (ms):", shown(s["tpot_mean"])),
        ("Median TPOT (ms):", shown(s["tpot_p50"])),
        ("P99 TPOT (ms):", shown(s["tpot_p99"])),
        ("Mean ITL (ms):", shown(s["itl_mean"])),
        ("Median ITL (ms):", shown(s["itl_p50"])),
        ("P99 ITL (ms):", shown(s["itl_p99"])),
        *([] if engine else [("Mean ITL in the server (ms):", shown(s["server_itl_mean"]))]),
    ]
    lines = [f"{f' {title} ':=^50}"] + [f"{k:<40}{v:>10}" for k, v in rows]
    lines += [f"TTFT measured by: {ttft_source(s, engine)}", "=" * 50]
    if math.isnan(s["itl_mean"]) and not engine:
        lines.append("(no text was streamed: ITL has no client-side samples)")
    return "\n".join(lines)


def table(levels: list[tuple[int, dict[str, float], dict[str, float] | None]]) -> str:
    """One row per concurrency: the server as a client sees it, then the engine alone."""
    head = (
        "| C | req/s | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | ITL p50 / p99 ms "
        "| engine alone: out tok/s | TTFT p50 ms | TPOT p50 ms | server overhead per token "
        "ms (TPOT mean) |"
    )
    lines = [head, "|" + "---:|" * 10]
    for c, s, e in levels:
        engine = (
            f"{e['out_tok_s']:.0f} | {shown(e['ttft_p50'], '.1f')} | {shown(e['tpot_p50'])} | "
            f"{shown(s['tpot_mean'] - e['tpot_mean'], '+.3f')}"
            if e
            else "- | - | - | -"
        )
        lines.append(
            f"| {c} | {s['req_s']:.2f} | {s['out_tok_s']:.0f} | {shown(s['ttft_p50'], '.1f')} / "
            f"{shown(s['ttft_p99'], '.1f')} | {shown(s['tpot_p50'])} / {shown(s['tpot_p99'])} | "
            f"{shown(s['itl_p50'])} / {shown(s['itl_p99'])} | {engine} |"
        )
    return "\n".join(lines)


def markdown_report(
    meta: dict[str, str], levels: list[tuple[int, dict[str, float], dict[str, float] | None]]
) -> str:
    """The block docs/performance.md takes: where and what ran, then per concurrency the
    server's TPOT against the engine's alone, TTFT and output tok/s."""
    lines = [
        f"### Serving: {meta['model']}, {meta['backend']}, {meta['date']}",
        "",
        f"- date {meta['date']}, device {meta['device']}, commit {meta['commit']}",
        f"- server: `{meta['server']}`",
        f"- workload: {meta['workload']}",
        "",
        "| C | server TPOT mean ms | engine TPOT mean ms | overhead per token ms "
        "| TTFT p50 ms server / engine | out tok/s server / engine | TTFT measured by |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c, s, e in levels:
        e = e or dict.fromkeys(s, float("nan"))
        lines.append(
            f"| {c} | {shown(s['tpot_mean'])} | {shown(e['tpot_mean'])} "
            f"| {shown(s['tpot_mean'] - e['tpot_mean'], '+.3f')} "
            f"| {shown(s['ttft_p50'], '.1f')} / {shown(e['ttft_p50'], '.1f')} "
            f"| {s['out_tok_s']:.1f} / {shown(e['out_tok_s'], '.1f')} | {ttft_source(s)} |"
        )
    return "\n".join(lines)


def agent_table(modes: dict[str, dict]) -> str:
    """Per mode: TTFT of every turn, then turn 1 against the later turns and the totals."""
    lines = [
        "| cache | turn | requests | prompt tokens (mean) | cached share "
        "| TTFT mean / p50 / p90 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode, s in modes.items():
        for t in s["turns"]:
            lines.append(
                f"| {mode} | {t['turn']} | {t['requests']} | {t['prompt_tokens_mean']:.0f} | "
                f"{t['cached_share']:.1%} | {t['ttft_mean']:.1f} / {t['ttft_p50']:.1f} / "
                f"{t['ttft_p90']:.1f} |"
            )
    lines += [
        "",
        "| cache | turn 1 TTFT mean / p50 / p90 ms | turn 1 after the first client "
        "| turns 2+ TTFT mean / p50 / p90 ms "
        "| out tok/s | cached share | preemptions | ok / failed | duration s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, s in modes.items():
        first, followers, later = (
            " / ".join(f"{t[k]:.1f}" for k in ("ttft_mean", "ttft_p50", "ttft_p90"))
            for t in (s["first_turn"], s["first_turn_followers"], s["later_turns"])
        )
        lines.append(
            f"| {mode} | {first} | {followers} | {later} | {s['out_tok_s']:.1f} "
            f"| {s['cached_share']:.1%} "
            f"| {s['preemptions']:.0f} "
            f"| {s['ok']} / {s['failed']} | {s['duration_s']:.1f} |"
        )
    return "\n".join(lines)
