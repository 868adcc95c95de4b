"""``ninfer-bench cache`` on the CPU: a cached prefix's TTFT against cold, and requests that
complete, as they would unconstrained, in a pool too small for all of them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ninfer_runtime.bench import cache as C
from ninfer_runtime.bench import measure as M
from ninfer_runtime.bench.cli import main
from ninfer_runtime.engine import Finished, TokenEvent, Usage
from ninfer_runtime.models import load_model

#: 300-token requests take 2 pages of 256 tokens each: 4 of them cannot all grow in a pool
#: of 2 full-length requests, so some are preempted and replayed
SMALL = ["--prefix", "64", "--suffix", "8", "--cached-requests", "2", "--context", "300"]
SMALL += ["--max-tokens", "100", "--requests", "4", "--full-requests", "2", "--chunk", "32"]


@pytest.fixture(scope="module")
def run(artifact_path, tmp_path_factory):
    art = artifact_path("qwen3_5_bf16", "dense")
    out = tmp_path_factory.mktemp("bench_cache")
    record = out / "performance.md"
    record.write_text("# Performance\n")
    args = ["cache", str(art), "--backend", "cpu", *SMALL, "--json", str(out / "rows.json")]
    args += ["--record", str(record), "--commit", "abc1234"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "rows.json").read_text())
    return result.output, {r["kind"]: r for r in rows}, record.read_text()


def test_the_cached_request_resumes_from_the_whole_prefix(run) -> None:
    output, rows, _ = run
    ttft = rows["prefix ttft"]
    assert ttft["cached_tokens"] == 64
    assert "| prefix | suffix | cold ms | floor ms | cached ms |" in output
    assert f"| 64 | 8 | {ttft['cold_ms']:.1f} |" in output
    assert 0 < ttft["cached_floor_ms"] < ttft["cold_floor_ms"]
    assert ttft["ratio"] == pytest.approx(ttft["cached_ms"] / ttft["cold_ms"])


def test_every_request_completes_under_pressure_with_unconstrained_outputs(run) -> None:
    output, rows, _ = run
    p = rows["pressure"]
    assert (p["completed"], p["requests"], p["generated"]) == (4, 4, 400)
    assert p["pool_pages"] == 4 and p["pages_per_request"] == 2
    assert p["preemptions"] >= 1 and p["replayed_tokens"] >= 1
    assert p["matches"] is True
    assert p["tokens_per_s"] == pytest.approx(p["generated"] / p["wall_s"])
    assert "| 4 / 4 |" in output and "| yes |" in output


def test_record_appends_a_section_with_the_tables(run) -> None:
    _, _, text = run
    assert text.startswith("# Performance\n\n### `ninfer-bench cache` ")
    assert "commit abc1234, K/V float32" in text
    assert "| completed | wall s |" in text and "| 4 / 4 |" in text


def test_prefill_flops_of_a_resumed_chunk(artifact_path) -> None:
    """Tokens read after a prefix cost their projections and attention over the prefix:
    together with the prefix's own cost, what the whole prompt costs read at once."""
    model = load_model(artifact_path("qwen3_5_bf16", "dense"))
    whole = M.prefill_flops(model, 300)
    assert M.prefill_flops(model, 200) + M.prefill_flops(model, 100, past=200) == pytest.approx(
        whole, rel=1e-3
    )


def test_max_tokens_must_leave_a_prompt(artifact_path) -> None:
    art = str(artifact_path("qwen3_5_bf16", "dense"))
    result = CliRunner().invoke(main, ["cache", art, "--context", "64", "--max-tokens", "64"])
    assert result.exit_code == 2 and "--max-tokens" in result.output


class _Scripted:
    """An engine whose steps are given: (events, lanes in use after the step)."""

    def __init__(self, steps):
        self.steps, self.lanes_in_use, self._ids = list(steps), 0, iter("ab")

    def submit(self, request) -> str:
        return next(self._ids)

    @property
    def has_work(self) -> bool:
        return bool(self.steps)

    def step(self):
        events, self.lanes_in_use = self.steps.pop(0)
        return events


def _done(rid: str) -> Finished:
    return Finished(rid, "length", None, Usage(3, 1), 0.0, 0.0)


def test_waiting_requests_are_served_after_every_lane_ends_in_one_step() -> None:
    """All running lanes may end in the same step, the waiting ones admitted in the next."""
    engine = _Scripted([
        ([TokenEvent("a", 7), _done("a")], 0), ([], 1), ([TokenEvent("b", 8), _done("b")], 0),
    ])  # fmt: skip
    run = C._run_together(engine, np.zeros((2, 3), dtype=np.int64), 1)
    assert (run.completed, run.outputs, run.most_running) == (2, [[7], [8]], 1)


def test_a_request_that_can_never_be_admitted_ends_the_run_incomplete() -> None:
    engine = _Scripted([([TokenEvent("a", 7), _done("a")], 0), ([], 0), ([], 0)])
    run = C._run_together(engine, np.zeros((2, 3), dtype=np.int64), 1)
    assert (run.completed, run.outputs) == (1, [[7], []])
    assert engine.steps == [([], 0)]  # it stopped at the first idle step
