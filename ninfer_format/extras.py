"""The optional layers: a command whose extra is not installed says so in one line.

``pip install ninfer`` installs this package's dependencies only; the converter, the engine and
the server need an extra (``convert``, ``runtime``, ``serve``, ``gpu``). The extras' contents
are read from the installed package's own metadata (pyproject.toml), so they are listed once.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

import click

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def requirements(extra: str) -> list[str]:
    """Distribution names the extra installs, those of the extras it includes too, in order."""
    try:
        declared = metadata.requires("ninfer") or []
    except metadata.PackageNotFoundError:  # run from a source tree: nothing to go by
        return []
    names: list[str] = []
    for line in declared:
        requirement, _, marker = line.partition(";")
        wanted = _EXTRA_MARKER.search(marker)
        if wanted is None or wanted.group(1) != extra:
            continue
        match = _NAME.match(requirement)
        if match is None:
            continue
        name, included = match.groups()
        if name.lower() == "ninfer":
            for inner in (included or "").split(","):
                names += [n for n in requirements(inner.strip()) if n not in names]
        elif name not in names:
            names.append(name)
    return names


def missing(extra: str) -> list[str]:
    """The extra's distributions that are not installed."""
    absent = []
    for name in requirements(extra):
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            absent.append(name)
    return absent


def require_extra(extra: str, command: str) -> None:
    """Exit with status 1 and one line naming ``extra`` when any of its packages is missing."""
    absent = missing(extra)
    if absent:
        click.echo(
            f"{command} needs the {extra} extra: pip install 'ninfer[{extra}]' "
            f"(missing: {', '.join(absent)})",
            err=True,
        )
        sys.exit(1)
