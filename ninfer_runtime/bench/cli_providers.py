"""``--provider FAMILY.OP=NAME``: an op served by one provider of the op catalogue for a
bench run, whatever its policy says, to compare providers in the engine itself."""

from __future__ import annotations

import contextlib
from typing import Any

import click

__all__ = ["force_providers", "parse_provider", "provider_option"]


def parse_provider(spec: str) -> tuple[str, str, str]:
    """``FAMILY.OP=NAME`` -> (family, op, name), checked against the op catalogue
    (ValueError saying what it takes)."""
    from ..ops import registry

    where, _, name = spec.partition("=")
    family, _, op = where.partition(".")
    try:
        known = registry.providers(family).get(op, {})
    except LookupError:
        known = None
    if not (family and op and name) or known is None or name not in known:
        choices = ", ".join(sorted(known)) if known else "FAMILY.OP=NAME of the op catalogue"
        raise ValueError(f"{spec!r}: expected {choices}")
    return family, op, name


def _forced(
    ctx: click.Context, param: click.Parameter, specs: tuple[str, ...]
) -> list[tuple[str, str, str]]:
    """``FAMILY.OP=NAME`` each, checked against the op catalogue."""
    try:
        return [parse_provider(spec) for spec in specs]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def provider_option(command: Any) -> Any:
    return click.option(
        "--provider",
        "forced",
        multiple=True,
        metavar="FAMILY.OP=NAME",
        callback=_forced,
        help="serve an op by this provider whatever its policy says (repeatable; e.g. "
        "delta_rule.prefill=fla), to compare providers in the engine",
    )(command)


def force_providers(forced: list[tuple[str, str, str]]) -> None:
    """Each (family, op, provider) forced until the command ends, and said so."""
    from ..ops import registry

    overrides = contextlib.ExitStack()
    click.get_current_context().call_on_close(overrides.close)
    for family, op, name in forced:
        overrides.enter_context(registry.override(family, op, name))
        click.echo(f"{family}.{op} served by {name} (--provider)")
