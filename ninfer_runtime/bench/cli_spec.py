"""``ninfer-bench run --spec``: which K to time, then the tables of speculative rounds, draft
steps and (``--measure-acceptance``) acceptance measured through the engine."""

from __future__ import annotations

from typing import Any

import click


def chosen_draft_tokens(spec: str, given: list[int] | None, acceptance: bool) -> list[int]:
    """The K values to time: none without --spec; 1..5 by default with --spec mtp."""
    from ..errors import EngineError
    from ..speculative import MAX_DRAFT_TOKENS, SpecConfig

    if spec == "off":
        if given is not None or acceptance:
            option = "--draft-tokens" if given is not None else "--measure-acceptance"
            raise click.BadParameter(f"{option} needs --spec mtp", param_hint="--spec")
        return []
    drafts = given or list(range(1, MAX_DRAFT_TOKENS + 1))
    try:
        for k in drafts:
            SpecConfig(method=spec, draft_tokens=k)
    except EngineError as exc:
        hint = "--spec" if "method" in str(exc) else "--draft-tokens"
        raise click.BadParameter(str(exc), param_hint=hint) from None
    return drafts


def spec_tables(
    runner: Any,
    drafts: list[int],
    plain: dict[tuple[int, int], float],
    rounds: int,
    bandwidth: float,
    kv_dtype: str,
) -> list[dict]:
    """A round of each K at each (lanes, context) against the plain step, then a draft
    step's cost with the proposal head and with the full vocabulary."""
    from . import measure as M

    rows: list[dict] = []
    rates = "".join(f" {f'a={a:g}':>14}" for a in M.ACCEPTANCE_RATES)
    click.echo(
        "speculative rounds (draft + verify + commit); tok/s (speed-up) at per-position "
        "acceptance a"
    )
    click.echo(
        f"{'lanes':>5} {'context':>7} {'K':>2} {'ms/step':>8} {'ms/round':>8} {'ratio':>6} "
        f"{'GB/round':>8} {'floor ms':>8} {'% floor':>7} {'plain tok/s':>11}{rates}"
    )
    for (n, context), step_ms in plain.items():
        for k in drafts:
            r = M.spec_round_rate(
                runner, n, context, k, step_ms=step_ms, floor_bw=bandwidth, rounds=rounds,
                kv_dtype=kv_dtype,
            )  # fmt: skip
            rows.append({"kind": "spec", **M.as_row(r)})
            implied = "".join(
                f" {f'{r.tokens_per_s(a):.1f} ({r.speedup(a):.2f}x)':>14}"
                for a in M.ACCEPTANCE_RATES
            )
            click.echo(
                f"{n:>5} {context:>7} {k:>2} {r.step_ms:>8.2f} {r.round_ms:>8.2f} "
                f"{r.ratio:>5.2f}x {r.bytes_per_round / 1e9:>8.2f} {r.floor_ms:>8.2f} "
                f"{r.percent_of_floor:>6.1f}% {r.plain_tokens_per_s:>11.1f}{implied}"
            )
    if runner.model.proposal_head is None:
        click.echo("no proposal head: draft steps score the full vocabulary")
        return rows
    click.echo("one draft step (MTP block + head): proposal rows (optimized) vs full vocabulary")
    click.echo(
        f"{'lanes':>5} {'context':>7} {'rows':>7} {'opt ms':>8} {'floor ms':>8} "
        f"{'full ms':>8} {'floor ms':>8} {'saved':>6}"
    )
    for n, context in plain:
        d = M.draft_step_rate(runner, n, context, floor_bw=bandwidth, kv_dtype=kv_dtype)
        rows.append({"kind": "draft", **M.as_row(d)})
        click.echo(
            f"{n:>5} {context:>7} {d.proposal_rows:>7} {d.optimized_ms:>8.3f} "
            f"{d.optimized_floor_ms:>8.3f} {d.full_ms:>8.3f} {d.full_floor_ms:>8.3f} "
            f"{100 * (1 - d.optimized_ms / d.full_ms):>5.0f}%"
        )
    return rows


def acceptance_table(
    artifact: Any, backend: str, drafts: list[int], answer_tokens: int, kv_dtype: str
) -> list[dict]:
    """Measured acceptance and tok/s of greedy answers to the demo prompts, per K."""
    from . import measure as M

    results = M.measure_acceptance(
        artifact, backend, drafts, max_tokens=answer_tokens, kv_dtype=kv_dtype
    )
    click.echo(
        f"measured on {len(M.DEMO_PROMPTS)} demo prompts (greedy, one lane, through the engine)"
    )
    click.echo(
        f"{'K':>2} {'tokens':>6} {'accepted':>8} {'tok/round':>9} {'tok/s':>8} "
        f"{'plain tok/s':>11} {'speed-up':>8} {'same tokens':>11}"
    )
    rows = []
    for a in results:
        rows.append({"kind": "acceptance", **M.as_row(a)})
        click.echo(
            f"{a.draft_tokens:>2} {a.tokens:>6} {100 * a.acceptance:>7.1f}% "
            f"{a.tokens_per_round:>9.2f} {a.tokens_per_s:>8.1f} {a.plain_tokens_per_s:>11.1f} "
            f"{a.speedup:>7.2f}x {'yes' if a.same_tokens else 'NO':>11}"
        )
    return rows
