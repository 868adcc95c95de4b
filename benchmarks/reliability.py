"""Reliability benchmark: attack ninfer for a bounded time and count what breaks.

Five attack families share the ``--seconds`` budget: each gets an equal share of what is left
when it starts (time one family does not use goes to the next; the server's start-up is shared
by the families that use it) and runs at least one case, so a share shorter than one case is
overrun by that case only.

* ``files``: hostile file sets (truncated, bit-flipped, mutated directory JSON, broken and
  renamed parts, edited checksum keys) opened and used through the library and checked with
  ``ninfer-inspect --verify --strict``. A failure is an exception that is not an
  ``ArtifactError``, a hang, an "internal error" or traceback from the inspector, or a strict
  verify that passes an artifact which then fails to load or leaves objects unchecksummed.
* ``kills``: ``ninfer-convert --force`` of the bundled model over an existing artifact
  (sharded and single-file), killed with SIGKILL at random times, killed at the N-th rename
  and failed with EIO at the N-th rename. A failure is a target that is not the old or the new
  artifact whole, a report that describes another artifact, a traceback for an OS error, or
  stray files that a later completed run leaves in place.
* ``overload``: concurrent chat, responses and messages requests (some abandoned by the
  client) against a live ``ninfer-serve`` with one lane and two queue places, then one large
  prompt. A failure is a 5xx other than 503/504/529, a hang, ``/health`` not answering within
  1 s, or ``ninfer_requests_total`` not counting every request.
* ``bodies``: malformed bodies to every POST endpoint (deep nesting, truncation, huge
  strings, every field given every wrong type, non-UTF-8). A failure is a 5xx, a hang, an
  error body that is not the protocol's JSON error shape with a code, or one that echoes the
  input (over 64 KiB).
* ``schema``: schemathesis against the live server's ``/openapi.json`` with its default
  checks, for the family's share of the budget.

    python benchmarks/reliability.py --seconds 120
    python benchmarks/reliability.py --seconds 600 --only files,bodies --seed 7

Prints one table (family, cases, failures, the first failures with what reproduces them) and
exits 1 when anything failed. docs/reliability.md records the results.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# The families live in the package beside this script (this folder is first on sys.path).
from reliability_attacks.report import print_table, write_report  # noqa: E402
from reliability_attacks.runner import FAMILIES, run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120, help="total time budget")
    parser.add_argument("--only", default=",".join(FAMILIES), help="comma-separated families")
    parser.add_argument("--seed", type=int, default=0, help="seed for every random choice")
    parser.add_argument("--report", type=Path, help="also write every failure to this JSON file")
    args = parser.parse_args(argv)
    chosen = {f.strip() for f in args.only.split(",") if f.strip()}
    families = [f for f in FAMILIES if f in chosen]
    unknown = sorted(chosen - set(FAMILIES))
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
    tallies = run(families, args.seconds, args.seed)
    print_table(tallies, args.seconds, args.seed)
    if args.report:
        write_report(args.report, tallies, args.seconds, args.seed)
    return 1 if any(t.failures for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
