"""What ``ninfer`` prints: the reply, and the summary lines after it.

The reply goes to standard output (its reasoning dimmed, ``[reasoning]`` first), as it is
generated with ``--stream`` or once it is whole; ``--print-token-ids`` adds the generated ids
as JSON. The prompt and decode rates (and with ``--stats`` speculative decoding's
acceptance) go to standard error, so a script reading the reply gets the reply alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from .request import Finished
    from .speculative import SpecStats


def print_reply(events: Iterable[Any], *, stream: bool, print_token_ids: bool) -> Finished:
    """Print the reply the engine's ``events`` make, and return their ``Finished``."""
    from .engine import Finished, OutputEvent, TokenEvent
    from .frontend import ReasoningDelta, TextDelta, ToolCallArgumentsDelta, ToolCallStart

    reasoning, text, ids = [], [], []
    in_reasoning = False
    finished = None
    for event in events:
        if isinstance(event, TokenEvent):
            ids.append(event.token_id)
        elif isinstance(event, OutputEvent):
            e = event.event
            if isinstance(e, ReasoningDelta):
                reasoning.append(e.text)
                if stream:
                    if not in_reasoning:
                        click.secho("[reasoning] ", dim=True, nl=False)
                        in_reasoning = True
                    click.secho(e.text, dim=True, nl=False)
            elif isinstance(e, TextDelta | ToolCallStart | ToolCallArgumentsDelta):
                piece = (
                    e.text
                    if isinstance(e, TextDelta | ToolCallArgumentsDelta)
                    else f"\n[tool call {e.name}] "
                )
                text.append(piece)
                if stream:
                    if in_reasoning:
                        click.echo("\n")
                        in_reasoning = False
                    click.echo(piece, nl=False)
        elif isinstance(event, Finished):
            finished = event
    if stream:
        click.echo("")
    else:
        if "".join(reasoning).strip():
            click.secho("[reasoning] " + "".join(reasoning).strip(), dim=True)
            click.echo("")
        click.echo("".join(text))
    if print_token_ids:
        click.echo(json.dumps(ids))
    assert finished is not None
    return finished


def usage_summary(finished: Finished, loaded: float) -> str:
    """The line after the reply: its tokens and rates, why it ended, and the load time."""
    u = finished.usage
    prompt_rate = u.prompt_tokens / max(finished.prompt_seconds, 1e-9)
    decode_rate = max(u.completion_tokens - 1, 0) / max(finished.decode_seconds, 1e-9)
    images = f" ({u.images} images)" if u.images else ""
    return (
        f"[{u.prompt_tokens} prompt tokens{images} at {prompt_rate:.1f} tok/s, "
        f"{u.completion_tokens} "
        f"generated at {decode_rate:.1f} tok/s, finish: {finished.reason}, load {loaded:.2f} s]"
    )


def spec_summary(stats: SpecStats | None) -> str:
    """The ``--stats`` line: how many drafts verification kept, overall and by position."""
    if stats is None:
        return "[speculative decoding off]"
    by_position = " ".join(
        f"{count / max(stats.rounds, 1):.0%}" for count in stats.accepted_per_position
    )
    fallbacks = f", {stats.fallbacks} step(s) without drafts" if stats.fallbacks else ""
    return (
        f"[speculative: {stats.accepted}/{stats.drafted} drafts accepted "
        f"({stats.acceptance_rate:.1%}), {stats.tokens_per_round:.2f} tokens per round over "
        f"{stats.rounds} rounds, by position {by_position}{fallbacks}]"
    )
