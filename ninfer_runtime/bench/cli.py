"""``ninfer-bench``: benchmark helpers. ``synth`` writes a synthetic artifact."""

from __future__ import annotations

import sys
import time

import click

from ninfer_format.errors import ArtifactError, TargetExists
from ninfer_format.extras import require_extra
from ninfer_format.progress import terminal_bar

from ..state import KV_DTYPES
from .geometries import GEOMETRIES


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """ninfer benchmark tools."""


@main.command()
@click.option("--geometry", type=click.Choice(sorted(GEOMETRIES)), required=True)
@click.option("--formats", required=True, help="recipe name, e.g. qwen3_6_27b_nvfp4")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--force", is_flag=True, help="overwrite an existing artifact")
@click.option("--plan-only", is_flag=True, help="print the planned size, write nothing")
@click.option(
    "--mtp/--no-mtp",
    default=True,
    show_default=True,
    help="write the recipe's MTP component (the drafter of --spec mtp)",
)
@click.option(
    "--proposal-rows",
    type=int,
    help="rows of the indexed proposal head (default: 131072 capped by the vocabulary when "
    "there is an MTP component; 0: none)",
)
def synth(
    geometry: str,
    formats: str,
    output: str,
    seed: int,
    force: bool,
    plan_only: bool,
    mtp: bool,
    proposal_rows: int | None,
) -> None:
    """Write a synthetic artifact: random valid codes and scales, no checkpoint needed."""
    require_extra("convert", "ninfer-bench synth")
    from .synthetic import plan_synthetic, write_synthetic

    try:
        plan = plan_synthetic(geometry, formats, mtp=mtp, proposal_rows=proposal_rows)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--proposal-rows") from None
    parts = ", ".join(f"{c} {b / 1e9:.3f}" for c, b in plan.bytes_by_component().items())
    click.echo(
        f"{geometry} / {plan.recipe.name}: {len(plan.parents)} weight objects, "
        f"{plan.payload_bytes / 1e9:.3f} GB planned ({parts} GB)"
    )
    if plan_only:
        return
    try:
        report = write_synthetic(
            output,
            geometry,
            formats,
            seed,
            force,
            mtp=mtp,
            proposal_rows=proposal_rows,
            progress=terminal_bar,
        )
    except TargetExists:
        raise click.ClickException(f"{output}: already exists; add --force to replace it") from None
    except (ArtifactError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"wrote {output}: {report.payload_bytes / 1e9:.3f} GB in {report.seconds:.1f} s "
        f"({report.mb_per_s:.0f} MB/s)"
    )


def _ints(ctx: click.Context | None, param: click.Parameter | None, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise click.BadParameter(f"expected comma-separated positive integers, got {text!r}")
    return values


@main.command()
@click.argument("artifact", type=click.Path(exists=True, dir_okay=False))
@click.option("--backend", type=click.Choice(["cpu", "cuda"]), default="cuda", show_default=True)
@click.option(
    "--lanes", default="1,2,4,8", show_default=True, callback=_ints, help="decode lane counts"
)
@click.option(
    "--contexts", default="1024,16384", show_default=True, callback=_ints, help="decode contexts"
)
@click.option("--steps", type=int, default=32, show_default=True, help="timed decode steps")
@click.option("--prefill", type=int, default=7680, show_default=True, help="0 skips prefill")
@click.option("--chunk", type=int, default=2048, show_default=True, help="prefill chunk")
@click.option(
    "--kv-dtype", type=click.Choice(list(KV_DTYPES)), default="float32", show_default=True
)
@click.option("--profile", "profile_lanes", type=int, default=0, help="also profile N lanes")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="write rows as JSON")
@click.option(
    "--record",
    type=click.Path(dir_okay=False, writable=True),
    help="append the run (date, device, commit, tables) to this markdown file",
)
@click.option(
    "--commit",
    help="the source commit --record names (default: git describe of the source tree)",
)
def run(
    artifact: str,
    backend: str,
    lanes: list[int],
    contexts: list[int],
    steps: int,
    prefill: int,
    chunk: int,
    kv_dtype: str,
    profile_lanes: int,
    json_out: str | None,
    record: str | None,
    commit: str | None,
) -> None:
    """Decode and prefill rates of ARTIFACT beside their floors.

    \b
    Example (27B shapes, q4/q5 weights, on the GPU):
      ninfer-bench synth --geometry qwen3_6_27b --formats qwen3_6_27b -o 27b.ninfer
      ninfer-bench run 27b.ninfer --record docs/performance.md
    """
    import json
    import os

    from ninfer_format import Artifact, ArtifactError

    from ..errors import EngineError
    from ..models import load_model
    from ..runner import ModelRunner
    from . import measure as M
    from . import record as R

    if record and not os.path.isdir(os.path.dirname(os.path.abspath(record))):
        raise click.BadParameter(f"{record}: its directory does not exist", param_hint="--record")
    started = time.perf_counter()
    try:
        runner = ModelRunner(load_model(Artifact.open(artifact), backend))
    except (ArtifactError, EngineError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"loaded {artifact} on {backend} in {time.perf_counter() - started:.1f} s")
    xp = runner.backend.xp
    bandwidth = M.copy_bandwidth(xp)
    click.echo(f"device-to-device copy: {bandwidth / 1e9:.0f} GB/s (read + write); K/V {kv_dtype}")
    rows: list[dict] = []
    click.echo(
        f"{'lanes':>5} {'context':>7} {'tok/s':>9} {'ms/step':>8} {'GB/step':>8} "
        f"{'floor ms':>8} {'% floor':>7}"
    )
    for context in contexts:
        for n in lanes:
            r = M.decode_rate(
                runner, n, context, steps=steps, floor_bw=bandwidth, kv_dtype=kv_dtype
            )
            rows.append({"kind": "decode", **M.as_row(r)})
            click.echo(
                f"{n:>5} {context:>7} {r.tokens_per_s:>9.1f} {r.step_ms:>8.2f} "
                f"{r.bytes_per_step / 1e9:>8.2f} {r.floor_ms:>8.2f} {r.percent_of_floor:>6.1f}%"
            )
    if prefill:
        rate = M.matmul_rate(xp)
        p = M.prefill_rate(runner, prefill, chunk=chunk, flop_rate=rate)
        rows.append({"kind": "prefill", **M.as_row(p), "matmul_flops": rate})
        click.echo(
            f"prefill {p.tokens} tokens (chunk {p.chunk}): {p.tokens_per_s:.0f} tok/s, "
            f"{p.seconds:.2f} s; {p.flops / 1e12:.1f} TFLOP at a measured "
            f"{rate / 1e12:.0f} TFLOP/s fp16 matmul = {p.floor_s:.2f} s floor "
            f"({p.percent_of_floor:.1f}%)"
        )
    if profile_lanes:
        spent = M.profile_decode(runner, profile_lanes, contexts[0])
        rows.append({"kind": "profile", "lanes": profile_lanes, **spent})
        click.echo(f"profile, {profile_lanes} lane(s): ms per step taken by each op (ablation)")
        for name, ms in spent.items():
            click.echo(f"  {name:<18} {ms:8.3f}")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(rows, f, indent=1)
    if record:
        context = R.run_context(xp, artifact, kv_dtype, bandwidth, commit)
        R.append(record, R.markdown(rows, context))
        click.echo(f"recorded in {record}")


if __name__ == "__main__":
    sys.exit(main())
