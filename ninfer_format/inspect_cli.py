"""``ninfer-inspect``: describe, validate and verify a .ninfer v3 artifact without a GPU."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from .errors import ArtifactError, LookupFailed, MissingFile
from .progress import terminal_bar
from .reader import Artifact
from .summary import summarize
from .verify import bytes_to_check, verify

EXIT_VALID, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)


def _print_text(s: dict[str, Any], show_objects: bool) -> None:
    echo = click.echo
    echo(f"artifact     {s['path']}")
    echo(f"artifact_id  {s['artifact_id']}")
    echo(f"dialects     {', '.join(s['dialects'])}")
    echo(
        f"payload      {s['payload_bytes']} bytes ({_human(s['payload_bytes'])}), "
        f"directory {s['json_bytes']} bytes, payload starts at {s['entry_payload_start']}"
    )
    echo("files")
    for f in s["files"]:
        echo(f"  [{f['index']}] {f['path']}  {f['file_size']} bytes (payload {f['payload_bytes']})")
    echo("components")
    for cid, c in s["components"].items():
        target = f" -> {c['target']}" if c["target"] else ""
        echo(f"  {cid}{target}: {json.dumps(c['summary'])}")
        for role, oid in c["resources"].items():
            echo(f"      resource {role} = {oid}")
        if c["proposal"]:
            echo(f"      proposal {json.dumps(c['proposal'])}")
    if show_objects:
        echo(f"objects ({len(s['objects'])})")
        width = max(len(o["id"]) for o in s["objects"])
        for o in s["objects"]:
            if o["kind"] == "tensor":
                what = f"{o['format']:<22} {o['layout']:<26} {o['shape']!s:<18}"
            else:
                what = f"{'resource':<22} {o['encoding']:<26} {'':<18}"
            echo(f"  {o['id']:<{width}}  {what} {o['bytes']:>14}  @{o['offset']}")
    echo("totals per format")
    for fmt, t in sorted(s["formats"].items()):
        bpw = f"{t['bits_per_weight']:.3f} bits/weight" if t["bits_per_weight"] else ""
        echo(f"  {fmt:<28} {t['objects']:>7} objects {t['bytes']:>16} bytes  {bpw}")
    echo(f"bindings {s['bindings']}, uses {s['uses']}")
    b = s["binder"]
    if b["binder"] is None:
        echo(f"binder       no binder for architecture {b['architecture']!r}")
    else:
        verdict = "ok" if b["ok"] else "FAILED"
        echo(f"binder       {b['binder']} ({b['parameters']} parameters): {verdict}")
    v = s["verify"]
    if v is not None:
        rate = v["checked_bytes"] / max(v["seconds"], 1e-9) / 1e9
        echo(
            f"verify       {v['checked_bytes']} bytes in {v['seconds']:.2f} s ({rate:.2f} GB/s), "
            f"{v['checksummed_objects']} of {len(s['objects'])} objects checksummed"
        )
    for w in s["warnings"]:
        echo(f"warning: {w}")
    for e in s["errors"]:
        echo(f"error: {e}")
    echo("valid" if s["valid"] else f"INVALID ({len(s['errors'])} errors)")


def _dump(artifact: Artifact, name: str, output: Path) -> str:
    if name in artifact.objects:
        obj = artifact.objects[name]
        if obj.kind == "resource":
            output.write_bytes(artifact.read(obj.offset, obj.bytes).tobytes())
            return f"wrote resource {name!r} ({obj.bytes} bytes) to {output}"
        values = artifact.tensor(name)
    elif name in artifact.bindings:
        values = artifact.parameter(name)
    else:
        raise LookupFailed(f"{name!r} is neither an object id nor a bound parameter")
    with output.open("wb") as fh:
        np.save(fh, values)
    return f"wrote {name!r} {values.dtype} {list(values.shape)} to {output}"


EPILOG = """\b
Examples:
  ninfer-inspect model.ninfer
  ninfer-inspect model.ninfer --verify --strict
  ninfer-inspect model.ninfer --json > model.json
  ninfer-inspect model.ninfer --dump text/final_norm -o final_norm.npy

Exit status: 0 valid, 1 invalid artifact, 2 bad usage or missing file."""


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
@click.option("--verify", "deep", is_flag=True, help="Read every byte: checksums, codes, scales.")
@click.option(
    "--strict",
    is_flag=True,
    help="Also check padding outside objects; warnings make the artifact invalid "
    "(except notes about what an older writer did not record).",
)
@click.option(
    "--dump",
    "dump_name",
    metavar="OBJECT_OR_PARAMETER",
    help="Decode one object or bound parameter to a .npy file (needs -o).",
)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="File for --dump.")
@click.option("--objects/--no-objects", default=True, help="List every object (text view).")
def main(path: Path, **options: Any) -> None:
    """Describe and validate the .ninfer v3 artifact at PATH (the entry file)."""
    opts = Options(**options)
    if opts.dump_name and opts.output is None:
        raise click.UsageError("--dump needs -o FILE")
    try:
        code = _run(path, opts)
    except MissingFile as exc:
        click.echo(f"ninfer-inspect: {exc}", err=True)
        code = EXIT_USAGE
    except Exception as exc:  # the promise is: never a traceback, whatever the input file
        click.echo(f"ninfer-inspect: internal error ({type(exc).__name__}: {exc})", err=True)
        code = EXIT_INVALID
    sys.exit(code)


@dataclass(frozen=True)
class Options:
    as_json: bool
    deep: bool
    strict: bool
    dump_name: str | None
    output: Path | None
    objects: bool


def _print_problems(problems: list[str]) -> None:
    for p in problems:
        click.echo(f"error: {p}")
    click.echo(f"INVALID ({len(problems)} errors)")


def _run(path: Path, opts: Options) -> int:
    try:
        artifact = Artifact.open(path)
    except MissingFile:
        raise
    except ArtifactError as exc:
        if opts.as_json:
            doc = {"path": str(path), "valid": False, "errors": exc.problems}
            click.echo(json.dumps(doc, indent=2))
        else:
            _print_problems(exc.problems)
        return EXIT_INVALID
    with artifact:
        try:
            return _report(artifact, opts)
        except ArtifactError as exc:  # something the per-object checks did not attribute
            _print_problems(exc.problems)
            return EXIT_INVALID


def _report(artifact: Artifact, opts: Options) -> int:
    if opts.dump_name:
        try:
            click.echo(_dump(artifact, opts.dump_name, opts.output))  # type: ignore[arg-type]
        except LookupFailed as exc:
            click.echo(f"ninfer-inspect: {exc}", err=True)
            return EXIT_USAGE
        return EXIT_VALID
    s = summarize(artifact)
    notes: list[str] = []  # warnings that stay warnings under --strict
    if opts.deep or opts.strict:
        with terminal_bar(bytes_to_check(artifact), "verifying", "B") as advance:
            report = verify(artifact, strict=opts.strict, progress=advance)
        s["errors"] += report.errors
        s["warnings"] += report.warnings
        notes = report.notes
        s["verify"] = {
            "checked_bytes": report.checked_bytes,
            "seconds": report.seconds,
            "checksummed_objects": report.checksummed,
            "errors": len(report.errors),
            "warnings": len(report.warnings) + len(report.notes),
        }
    if opts.strict and s["warnings"]:
        s["errors"] += [f"strict: {w}" for w in s["warnings"]]
        s["warnings"] = []
    s["warnings"] += notes
    s["valid"] = not s["errors"]
    if opts.as_json:
        click.echo(json.dumps(s, indent=2))
    else:
        _print_text(s, opts.objects)
    return EXIT_VALID if s["valid"] else EXIT_INVALID


if __name__ == "__main__":
    main()
