"""Where ``ninfer-bench run`` and ``cache`` put their rows: ``--json``, and ``--record`` (a
markdown file, with the commit it names) whose directory is checked before anything runs."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import click


def _record_directory(ctx: click.Context, param: click.Parameter, record: str | None) -> str | None:
    if record and not os.path.isdir(os.path.dirname(os.path.abspath(record))):
        raise click.BadParameter(f"{record}: its directory does not exist")
    return record


_OPTIONS = (
    click.option("--json", "json_out", type=click.Path(dir_okay=False), help="write rows as JSON"),
    click.option(
        "--record",
        type=click.Path(dir_okay=False, writable=True),
        callback=_record_directory,
        help="append the run (date, device, commit, tables) to this markdown file",
    ),
    click.option(
        "--commit",
        help="the source commit --record names (default: git describe of the source tree)",
    ),
)


def output_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--json``, ``--record`` and ``--commit`` on ``command`` (as ``json_out``, ``record``
    and ``commit``), in that order."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def write_rows(
    rows: list[dict], json_out: str | None, record: str | None, markdown: Callable[[], str]
) -> None:
    """``rows`` to ``json_out`` and, as ``markdown()`` (the run's section), to ``record``."""
    from . import record as R

    if json_out:
        with open(json_out, "w") as f:
            json.dump(rows, f, indent=1)
    if record:
        R.append(record, markdown())
        click.echo(f"recorded in {record}")
