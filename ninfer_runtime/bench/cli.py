"""``ninfer-bench``: benchmark helpers. ``synth`` writes a synthetic artifact, ``run`` times
one, ``cache`` times the prefix cache; each command lives in a module of its own."""

from __future__ import annotations

import sys

import click

from .cli_cache import cache
from .cli_run import run
from .cli_synth import synth


class _Commands(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        from ..ops.registry import NoProvider

        try:
            return super().invoke(ctx)
        except NoProvider as exc:  # e.g. --provider forced one that does not run here
            raise click.ClickException(str(exc)) from None


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """ninfer benchmark tools."""


main.add_command(synth)
main.add_command(run)
main.add_command(cache)


if __name__ == "__main__":
    sys.exit(main())
