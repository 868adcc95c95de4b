"""``ninfer-bench run --record``: a dated markdown section per run, appended safely."""

from __future__ import annotations

import re
import subprocess
from importlib import metadata

import numpy as np
import pytest
from click.testing import CliRunner

from ninfer_runtime.bench import record as R
from ninfer_runtime.bench.cli import main
from ninfer_runtime.bench.synthetic import write_synthetic

CTX = R.RunContext("2026-11-29 12:00 UTC", "NVIDIA H200", "abc1234", "27b.ninfer", "bfloat16", 4108)
ROWS = [
    {
        "kind": "decode", "lanes": 8, "context": 1024, "tokens_per_s": 398.741,
        "step_ms": 20.063, "bytes_per_step": 18971671808, "floor_ms": 4.618,
        "percent_of_floor": 23.019,
    },
    {
        "kind": "prefill", "tokens": 7680, "chunk": 2048, "tokens_per_s": 2444.9,
        "seconds": 3.141, "flops": 385.65e12, "floor_s": 0.52, "percent_of_floor": 16.56,
        "matmul_flops": 741.4e12,
    },
    {"kind": "profile", "lanes": 1, "step": 13.063, "linear": 9.82},
]  # fmt: skip


def test_section_names_date_device_commit_and_lists_every_row() -> None:
    text = R.markdown(ROWS, CTX)
    assert text.startswith("### `ninfer-bench run` 27b.ninfer, 2026-11-29 12:00 UTC")
    assert "NVIDIA H200, commit abc1234, K/V bfloat16" in text and "4108 GB/s" in text
    assert "| 8 | 1024 | 398.7 | 20.06 | 18.97 | 4.62 | 23.0% |" in text
    assert "Prefill of 7680 tokens (chunks of 2048): 2445 tok/s" in text
    assert "(16.6%)" in text and "`linear` 9.820" in text


def test_append_keeps_what_the_file_held(tmp_path) -> None:
    path = tmp_path / "performance.md"
    path.write_text("# Performance\n\nearlier runs\n")
    R.append(path, "### one\n")
    R.append(path, "### two\n")
    assert path.read_text() == "# Performance\n\nearlier runs\n\n### one\n\n### two\n"
    assert [p.name for p in tmp_path.iterdir()] == ["performance.md"]  # no temporary left


def test_append_creates_a_missing_file(tmp_path) -> None:
    path = tmp_path / "new.md"
    R.append(path, "### one")
    assert path.read_text() == "### one\n"


def test_commit_is_git_describe_of_the_source_tree() -> None:
    try:
        expected = subprocess.run(
            ["git", "-C", str(R.SOURCE_DIR), "rev-parse", "--short=7", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the source tree is not a git checkout here")
    assert R.source_commit().startswith(expected[:7])


def test_commit_outside_a_checkout_falls_back_to_the_version(tmp_path) -> None:
    try:
        expected = f"ninfer {metadata.version('ninfer')}"
    except metadata.PackageNotFoundError:
        expected = "unknown"
    assert R.source_commit(tmp_path) == expected


def test_run_records_its_tables(tmp_path) -> None:
    artifact = tmp_path / "s.ninfer"
    write_synthetic(artifact, "tiny_dense", "qwen3_6_27b", seed=1)
    path = tmp_path / "perf.md"
    args = ["run", str(artifact), "--backend", "cpu", "--lanes", "1,2", "--contexts", "16"]
    args += ["--steps", "2", "--prefill", "0", "--record", str(path)]
    for extra in ([], ["--commit", "v1-test"]):
        result = CliRunner().invoke(main, args + extra)
        assert result.exit_code == 0, result.output
    text = path.read_text()
    assert text.count("### `ninfer-bench run` s.ninfer, ") == 2
    assert text.count("commit v1-test,") == 1
    assert "CPU (" in text and "K/V float32" in text
    assert len(re.findall(r"^\| 2 \| 16 \| [\d.]+ \|", text, flags=re.M)) == 2
    assert np.isfinite(float(re.search(r"^\| 1 \| 16 \| ([\d.]+) \|", text, flags=re.M)[1]))


def test_record_into_a_missing_directory_fails_before_running(tmp_path) -> None:
    artifact = tmp_path / "s.ninfer"
    write_synthetic(artifact, "tiny_dense", "qwen3_6_27b", seed=1)
    missing = tmp_path / "nowhere" / "perf.md"
    result = CliRunner().invoke(main, ["run", str(artifact), "--record", str(missing)])
    assert result.exit_code == 2 and "directory does not exist" in result.output
    assert "loaded" not in result.output
