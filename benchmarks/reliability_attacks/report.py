"""What the benchmark prints (one row per family, the first failure of each of the first few
kinds) and the JSON file ``--report`` writes (every failure)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .bookkeeping import Tally

SHOWN_FAILURES = 3


def kinds(failures: list[str]) -> dict[str, list[str]]:
    """Failures grouped by what went wrong (numbers and quoted names aside), first seen first."""
    groups: dict[str, list[str]] = {}
    for failure in failures:
        what = failure.split(" <- ")[0]
        key = re.sub(r"'[^']*'|[0-9a-f]{8,}|\d+", "_", what)[:50]
        groups.setdefault(key, []).append(failure)
    return groups


def print_table(tallies: list[Tally], seconds: float, seed: int) -> None:
    """One row per family; below it the first failure of each of the first few kinds."""
    print(f"ninfer reliability: budget {seconds:.0f} s, seed {seed}")
    head = f"{'family':<9} {'cases':>6} {'failures':>8} {'seconds':>7}"
    print(f"{head}  first failures (reproduction)")
    for t in tallies:
        groups = list(kinds(t.failures).values())
        shown = [f"[{len(g)}x] {g[0]}" for g in groups[:SHOWN_FAILURES]]
        if len(groups) > SHOWN_FAILURES:
            shown.append(f"... and {len(groups) - SHOWN_FAILURES} more kinds")
        shown += [f"note: {n}" for n in t.notes[:2]]
        first = shown[0] if shown else "-"
        print(f"{t.family:<9} {t.cases:>6} {len(t.failures):>8} {t.seconds:>7.1f}  {first}")
        for line in shown[1:]:
            print(f"{'':<35}{line}")


def write_report(path: Path, tallies: list[Tally], seconds: float, seed: int) -> None:
    families = {
        t.family: {"cases": t.cases, "seconds": round(t.seconds, 1), "failures": t.failures,
                   "notes": t.notes}
        for t in tallies
    }  # fmt: skip
    doc = {"budget_seconds": seconds, "seed": seed, "families": families}
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
