"""``ninfer-bench synth``: a synthetic artifact of an official geometry, planned and written."""

from __future__ import annotations

from typing import Any

import click

from ninfer_format.errors import ArtifactError, TargetExists
from ninfer_format.extras import require_extra
from ninfer_format.progress import terminal_bar

from .geometries import GEOMETRIES


@click.command()
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
@click.option(
    "--layers",
    type=click.IntRange(min=1),
    help="write only this many decoder layers, at full width, keeping one of every kind "
    "(ninfer-bench run then extrapolates the whole model's step)",
)
@click.option(
    "--ple-rows-scale",
    type=click.FloatRange(min=0, max=1, min_open=True),
    default=1.0,
    show_default=True,
    help="n-gram (PLE) tables of about this share of their rows, for disk (a step reads as "
    "many rows either way)",
)
@click.option(
    "--vision",
    is_flag=True,
    help="also write a Qwen3.5 vision component (the released tower's geometry; Qwen3.5/3.6 "
    "geometries only) and its image processor config",
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
    layers: int | None,
    ple_rows_scale: float,
    vision: bool,
) -> None:
    """Write a synthetic artifact: random valid codes and scales, no checkpoint needed.

    \b
    Example (Qwen3.8-Flash-Next's layers at full width, three of its 48, tables at 1/16):
      ninfer-bench synth --geometry qwen3_8_flash_next --formats qwen3_8_flash_next \\
          --layers 3 --ple-rows-scale 0.0625 -o q38-3l.ninfer
    """
    require_extra("convert", "ninfer-bench synth")
    from ninfer_format.errors import ArtifactError as FormatError

    from .synthetic import RecipeError, plan_synthetic, write_synthetic

    shape = dict(
        mtp=mtp,
        proposal_rows=proposal_rows,
        layers=layers,
        ple_rows_scale=ple_rows_scale,
        vision=vision,
    )
    try:
        plan = plan_synthetic(geometry, formats, **shape)
    except RecipeError as exc:
        raise click.BadParameter(str(exc), param_hint="--formats") from None
    except (ValueError, FormatError) as exc:
        hint = next((o for o in ("--layers", "--vision") if o in str(exc)), "--proposal-rows")
        raise click.BadParameter(str(exc), param_hint=hint) from None
    parts = ", ".join(f"{c} {b / 1e9:.3f}" for c, b in plan.bytes_by_component().items())
    click.echo(
        f"{geometry} / {plan.recipe.name}: {len(plan.parents)} weight objects, "
        f"{plan.payload_bytes / 1e9:.3f} GB planned ({parts} GB)"
    )
    if plan.reduction is not None:
        _echo_reduction(plan.reduction)
    if mtp and "mtp" in plan.recipe.components and "mtp" not in plan.components:
        click.echo("no mtp component: the runtime runs no MTP block for this architecture")
    if plan_only:
        return
    try:
        report = write_synthetic(
            output, geometry, formats, seed, force, **shape, progress=terminal_bar
        )
    except TargetExists:
        raise click.ClickException(f"{output}: already exists; add --force to replace it") from None
    except (ArtifactError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"wrote {output}: {report.payload_bytes / 1e9:.3f} GB in {report.seconds:.1f} s "
        f"({report.mb_per_s:.0f} MB/s)"
    )


def _echo_reduction(reduced: dict[str, Any]) -> None:
    """What a reduced plan keeps and what it stands for."""
    whole = reduced["whole_bytes"]
    kinds = ", ".join(f"{k} x{n}" for k, n in reduced["whole_kinds"].items())
    click.echo(
        f"layers kept: {reduced['kept']} ({', '.join(reduced['kinds'])}) of "
        f"{sum(reduced['whole_kinds'].values())} ({kinds}); the whole model's text weights "
        f"{whole['weights'] / 2**30:.1f} GiB, routed experts {whole['experts'] / 2**30:.1f} GiB"
    )
    if reduced["ple_rows_scale"] != 1:
        click.echo(
            f"n-gram (PLE) tables at {reduced['ple_rows_scale']:g} of their rows (for disk; a "
            "step reads as many rows a token, so the step is unchanged but for caching)"
        )
