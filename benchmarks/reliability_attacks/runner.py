"""Runs the chosen families in turn, each with an equal share of what is left of the budget,
and collects their tallies; a family whose harness breaks is reported, not fatal."""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

from .bodies import attack_bodies
from .bookkeeping import Budget, Tally, short
from .files import attack_files
from .kills import attack_kills
from .live_server import HTTP_FAMILIES, LiveServer
from .overload import attack_overload
from .schema import attack_schema

#: Run in this order whatever --only says: the overload family's large prompt may keep the
#: shared server busy for a while, so it comes last.
FAMILIES = ("files", "kills", "bodies", "schema", "overload")


def run(families: list[str], seconds: float, seed: int) -> list[Tally]:
    total = Budget.of(seconds)
    tallies = []
    with tempfile.TemporaryDirectory(prefix="ninfer-reliability-") as tmp:
        work = Path(tmp)
        live = LiveServer(work)
        try:
            for i, family in enumerate(families):
                tally = Tally(family)
                started = time.monotonic()
                try:
                    if family in HTTP_FAMILIES:
                        live.get()  # its start-up shared by the families left, not this one's
                    share = Budget.of(total.left() / (len(families) - i))
                    _attack(family, share, random.Random(f"{seed}:{family}"), work, live, tally)
                except Exception as exc:  # the harness itself broke: say so, keep going
                    tally.fail(f"harness error: {type(exc).__name__}: {short(str(exc), 300)}")
                tally.seconds = time.monotonic() - started
                tallies.append(tally)
        finally:
            traces = live.tracebacks()
            live.stop()
    if traces:
        for tally in tallies:
            if tally.family in HTTP_FAMILIES:
                tally.notes.append(f"the server logged {len(traces)} tracebacks")
                break
    return tallies


def _attack(family: str, budget: Budget, rng: random.Random, work: Path, live: LiveServer,
            tally: Tally) -> None:  # fmt: skip
    if family == "files":
        attack_files(budget, rng, work, tally)
    elif family == "kills":
        attack_kills(budget, rng, work, tally)
    elif family == "overload":
        attack_overload(budget, rng, live, tally)
    elif family == "bodies":
        attack_bodies(budget, rng, live, tally)
    else:
        attack_schema(budget, rng, live, tally)
