"""``ninfer-convert``: checkpoints -> .ninfer v3 artifacts, driven by a recipe."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ninfer_format.extras import require_extra
from ninfer_format.framing import DEFAULT_SHARD_LIMIT

from .errors import ConvertError

EPILOG = """\b
Examples:
  ninfer-convert --recipe qwen3_6_27b --source Qwen/Qwen3.6-27B -o qwen3.6-27b.ninfer
  ninfer-convert --recipe qwen3_5_bf16 --source ./my-checkpoint -o model.ninfer --force
  ninfer-convert --recipe qwen3_8_27b_nvfp4 --source Qwen/Qwen3.8-27B \\
      --source quantized=unsloth/Qwen3.8-27B-NVFP4 -o q8-nvfp4.ninfer --device cuda
  ninfer-convert --list-recipes
  ninfer-convert verify model.ninfer --source ./my-checkpoint
"""


def _sources(specs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for spec in specs:
        role, sep, value = spec.partition("=")
        if not sep or "/" in role or role.startswith("."):
            role, value = "base", spec
        if role in out:
            raise click.BadParameter(f"source role {role!r} given twice", param_hint="--source")
        out[role] = value
    return out


def _fail(exc: Exception | str) -> None:
    click.echo(f"ninfer-convert: error: {exc}", err=True)
    sys.exit(1)


def _os_error(exc: OSError) -> str:
    """One line for a failure of the operating system (disk full, read-only, I/O error)."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


def _summary(description: str, indent: int) -> str:
    """A recipe's first paragraph, wrapped to the terminal below its name."""
    import shutil
    import textwrap

    paragraph = " ".join(description.split("\n\n")[0].split())
    width = max(shutil.get_terminal_size().columns, indent + 40)
    lines = textwrap.wrap(paragraph, width - indent, break_on_hyphens=False) or [""]
    return ("\n" + " " * indent).join(lines)


def _print_report(report) -> None:  # type: ignore[no-untyped-def]
    rows = report.parameters
    width = max((len(r.name) for r in rows), default=10)
    click.echo(f"{'parameter':<{width}}  {'format':<20} {'rmse':>10} {'max abs':>10} {'rel':>9}")
    for r in rows:
        click.echo(
            f"{r.name:<{width}}  {r.format:<20} {r.rmse:>10.3e} {r.max_abs:>10.3e} "
            f"{r.relative:>9.2e}"
        )
    click.echo("")
    for fmt, t in sorted(report.totals().items()):
        click.echo(
            f"{fmt:<22} {int(t['objects']):>6} objects {int(t['bytes']):>15} bytes "
            f"{t['bits_per_weight']:7.3f} bits/weight"
        )
    d = report.as_dict()
    click.echo(
        f"total {d['payload_bytes']} bytes payload, {d['bits_per_weight']:.3f} bits/weight, "
        f"{report.seconds:.1f} s, artifact {report.artifact_id}"
    )


@click.group(
    invoke_without_command=True,
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option("--recipe", help="Recipe name (see --list-recipes).")
@click.option(
    "--source",
    "source_specs",
    multiple=True,
    metavar="[ROLE=]PATH_OR_HF_ID",
    help="Checkpoint: local HF directory, org/name[@revision], or .gguf; repeatable "
    "with roles such as quantized=...",
)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Artifact entry file.")
@click.option(
    "--components",
    help="Comma-separated components: text, mtp, vision (default: the recipe's, plus vision "
    "when the source holds model.visual.* weights).",
)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option(
    "--shard-limit",
    type=int,
    default=DEFAULT_SHARD_LIMIT,
    show_default=True,
    help="Maximum bytes per file (0 = one file).",
)
@click.option("--force", is_flag=True, help="Replace an existing artifact.")
@click.option(
    "--proposal",
    "ranking",
    type=click.Path(path_type=Path),
    help="int64 token ranking file: adds the indexed proposal head.",
)
@click.option(
    "--proposal-rows",
    type=int,
    default=131072,
    show_default=True,
    help="Rows of the proposal head (special tokens always kept).",
)
@click.option("--list-recipes", is_flag=True, help="List the recipes and exit.")
@click.option("--quiet", is_flag=True, help="No progress bar and no report table.")
@click.pass_context
def main(
    ctx: click.Context,
    recipe: str | None,
    source_specs: tuple[str, ...],
    output: Path | None,
    components: str | None,
    device: str,
    shard_limit: int,
    force: bool,
    ranking: Path | None,
    proposal_rows: int,
    list_recipes: bool,
    quiet: bool,
) -> None:
    """Convert a checkpoint into a .ninfer v3 artifact with a recipe."""
    if ctx.invoked_subcommand is not None:
        return
    from .recipe import available_recipes, load_recipe

    if list_recipes:
        for name in available_recipes():
            try:
                text = load_recipe(name).description
            except ConvertError as exc:
                text = f"(broken: {exc})"
            click.echo(f"{name:<24} {_summary(text, 25)}")
        return
    if not recipe or not source_specs or output is None:
        raise click.UsageError("--recipe, --source and -o are required (or --list-recipes)")
    require_extra("convert", "ninfer-convert")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            _fail(ConvertError("--device cuda: torch sees no CUDA device"))
    from ninfer_format.progress import silent, terminal_bar

    from .errors import OutputExists
    from .pipeline import ProposalRequest, convert, report_path

    comps = tuple(c.strip() for c in components.split(",")) if components else None
    try:
        report = convert(
            recipe,
            _sources(source_specs),
            output,
            components=comps,
            device=device,
            shard_limit=shard_limit,
            force=force,
            progress=silent if quiet else terminal_bar,
            proposal=ProposalRequest(ranking, proposal_rows) if ranking else None,
        )
    except OutputExists as exc:
        _fail(f"{exc.path}: already exists; add --force to replace it")
    except ConvertError as exc:
        _fail(exc)
    except OSError as exc:
        _fail(_os_error(exc))
    except KeyboardInterrupt:
        click.echo("ninfer-convert: interrupted; the target is unchanged", err=True)
        sys.exit(130)
    if not quiet:
        _print_report(report)
    click.echo(f"wrote {output} (report: {report_path(output)})")


@main.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option(
    "--source", "source_specs", multiple=True, required=True, metavar="[ROLE=]PATH_OR_HF_ID"
)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def verify(artifact: Path, source_specs: tuple[str, ...], as_json: bool) -> None:
    """Decode every parameter of ARTIFACT and compare it with the source checkpoint."""
    require_extra("convert", "ninfer-convert verify")
    from ninfer_format.progress import terminal_bar

    from .verify import verify_against_source

    try:
        result = verify_against_source(artifact, _sources(source_specs), progress=terminal_bar)
    except ConvertError as exc:
        _fail(exc)
    except OSError as exc:
        _fail(_os_error(exc))
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        for row in result["parameters"]:
            click.echo(
                f"{row['name']:<60} {row['format']:<20} rmse {row['rmse']:.3e} "
                f"max {row['max_abs']:.3e}"
            )
        for problem in result["errors"]:
            click.echo(f"error: {problem}")
        click.echo("ok" if not result["errors"] else f"FAILED ({len(result['errors'])} errors)")
    sys.exit(0 if not result["errors"] else 1)


if __name__ == "__main__":
    main()
