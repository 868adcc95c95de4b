"""``ninfer-bench``: benchmark helpers. ``synth`` writes a synthetic artifact."""

from __future__ import annotations

import sys
import time

import click

from .synthetic import GEOMETRIES, plan_synthetic, write_synthetic


@click.group()
def main() -> None:
    """ninfer benchmark tools."""


@main.command()
@click.option("--geometry", type=click.Choice(sorted(GEOMETRIES)), required=True)
@click.option("--formats", required=True, help="recipe name, e.g. qwen3_6_27b_nvfp4")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--force", is_flag=True, help="overwrite an existing artifact")
@click.option("--plan-only", is_flag=True, help="print the planned size, write nothing")
def synth(
    geometry: str, formats: str, output: str, seed: int, force: bool, plan_only: bool
) -> None:
    """Write a synthetic artifact: random valid codes and scales, no checkpoint needed."""
    plan = plan_synthetic(geometry, formats)
    click.echo(
        f"{geometry} / {plan.recipe.name}: {len(plan.parents)} weight objects, "
        f"{plan.payload_bytes / 1e9:.3f} GB planned"
    )
    if plan_only:
        return
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.perf_counter()
        if now - last[0] > 2 or done == total:
            last[0] = now
            click.echo(f"  {done / 1e9:.2f} / {total / 1e9:.2f} GB", err=True)

    report = write_synthetic(output, geometry, formats, seed, force, progress=progress)
    click.echo(
        f"wrote {output}: {report.payload_bytes / 1e9:.3f} GB in {report.seconds:.1f} s "
        f"({report.mb_per_s:.0f} MB/s)"
    )


if __name__ == "__main__":
    sys.exit(main())
