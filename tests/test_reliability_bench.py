"""The reliability benchmark (benchmarks/reliability.py) itself works: every attack family runs
cases within its share of a small budget and the table reports them.

Whether the product survives the attacks is the benchmark's own verdict (its exit status); these
tests only check the harness, so they accept either status.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "reliability.py"
ROW = re.compile(r"^(?P<family>\w+)\s+(?P<cases>\d+)\s+(?P<failures>\d+)\s+(?P<seconds>[\d.]+)\s")


def run_benchmark(seconds: int, families: str) -> tuple[int, dict[str, dict[str, float]], str]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", str(seconds), "--only", families],
        cwd=ROOT, capture_output=True, text=True, timeout=seconds + 60,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    rows = {
        m["family"]: {k: float(m[k]) for k in ("cases", "failures", "seconds")}
        for m in map(ROW.match, result.stdout.splitlines())
        if m
    }
    output = result.stdout + result.stderr
    # a family whose share is shorter than one case still runs one; the machine may be busy
    assert elapsed < seconds + 45, f"{elapsed:.0f} s for a {seconds} s budget\n{output}"
    return result.returncode, rows, output


def check(seconds: int, families: list[str]) -> None:
    status, rows, output = run_benchmark(seconds, ",".join(families))
    assert "family" in output and "first failures" in output, output
    assert sorted(rows) == sorted(families), output
    for family, row in rows.items():
        assert row["cases"] > 0, (family, output)
    assert "harness error" not in output, output
    assert status == (1 if any(r["failures"] for r in rows.values()) else 0), output


def test_file_family():
    check(2, ["files"])


def test_conversion_family():
    pytest.importorskip("torch", reason="the kills family converts with ninfer[convert]")
    check(6, ["kills"])


def test_http_families():
    pytest.importorskip("litestar", reason="the HTTP families need ninfer[serve]")
    if not (Path(sys.executable).parent / "schemathesis").exists():
        pytest.skip("the schemathesis CLI is not installed beside this Python")
    check(9, ["bodies", "schema", "overload"])


def test_unknown_family_is_a_usage_error():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "1", "--only", "files,nope"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "nope" in result.stderr, result.stderr
