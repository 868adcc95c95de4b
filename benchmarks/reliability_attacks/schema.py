"""The ``schema`` family: schemathesis against the live server's ``/openapi.json`` with its
default checks, for the family's share of the budget; its cases and distinct failures are read
from schemathesis's ndjson report."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

from .bookkeeping import Budget, Tally, short
from .live_server import LiveServer
from .paths import ROOT

CASES_LINE = re.compile(r"(\d+) generated")


def attack_schema(budget: Budget, rng: random.Random, live: LiveServer, tally: Tally) -> None:
    server = live.get()
    seconds = max(int(budget.left()) - 3, 3)
    report = live.work / "schemathesis.json"
    cli = Path(sys.executable).parent / "schemathesis"
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.serve.schemathesis_hooks",
        "NINFER_TEST_MODEL": server.model,
        "PYTHONPATH": str(ROOT),
    }
    seed = rng.randrange(2**31)
    command = [
        str(cli), "run", f"{server.url}/openapi.json", "--max-time", str(seconds),
        "--seed", str(seed), "--request-timeout", "30", "--workers", "2", "--no-color",
        "--report", "ndjson", "--report-ndjson-path", str(report),
    ]  # fmt: skip
    try:
        result = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=seconds + 60
        )
        output = result.stdout
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout
        tally.fail(f"schemathesis ran past its budget of {seconds} s")
    cases, failures = _schemathesis_counts(report, output or "")
    tally.count(cases)
    for failure in failures:
        tally.fail(f"{failure} <- schemathesis run URL/openapi.json --seed {seed}")
    if not cases:
        tally.fail(f"schemathesis ran no case: {short((output or '')[-300:], 300)}")


def _schemathesis_counts(report: Path, output: str) -> tuple[int, list[str]]:
    """Cases generated and one line per distinct failure, from the ndjson event stream."""
    cases = 0
    failures: dict[str, None] = {}
    try:
        events = [json.loads(line) for line in report.read_text().splitlines() if line]
    except (OSError, ValueError):
        events = []
    for event in events:
        recorder = (event.get("ScenarioFinished") or {}).get("recorder") or {}
        recorded = recorder.get("cases") or {}
        cases += len(recorded)
        for case_id, checks in (recorder.get("checks") or {}).items():
            for check in checks:
                if check.get("status") != "failure":
                    continue
                case = (recorded.get(case_id) or {}).get("value") or {}
                info = (check.get("failure_info") or {}).get("failure") or {}
                where = f"{case.get('method', '')} {case.get('path', '')}"
                failures[f"{check.get('name')}: {where}: {short(info.get('title', ''), 60)}"] = None
    if not cases:
        cases = sum(int(n) for n in CASES_LINE.findall(output))
    return cases, list(failures)
