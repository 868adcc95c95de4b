"""benchmarks/logprobs_bench.py on the CPU with the bundled model (the figures themselves come
from a GPU run and go to docs/performance.md; here: that it runs and what it reports)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from tests.benchmarks import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


def load_bench():
    return load_benchmark("logprobs_bench")


def test_each_case_is_timed_beside_the_plain_step(artifact, tmp_path, monkeypatch, capsys):
    bench = load_bench()
    out = tmp_path / "lp.json"
    argv = ["logprobs_bench.py", str(artifact), "--backend", "cpu", "--tokens", "6"]
    argv += ["--prompt-tokens", "24", "--lanes", "2", "--repeat", "1", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    rows = json.loads(out.read_text())
    assert [r["what"] for r in rows] == ["plain", "logprobs=5", "prompt_logprobs=5"]
    assert all(r["step_ms"] > 0 and r["prompt_ms"] > 0 for r in rows)
    table = capsys.readouterr().out
    assert "| plain | " in table and "+0.0% |" in table and "| logprobs=5 | " in table


def test_a_request_that_ends_early_stops_the_bench(artifact, monkeypatch):
    bench = load_bench()
    from ninfer_runtime.engine import Engine

    engine = Engine(str(artifact), backend="cpu", max_lanes=1, max_context=64)
    # a stop token the first step samples ends the request before its tokens
    monkeypatch.setattr(bench, "SamplingParams", _ending_params(bench.SamplingParams))
    try:
        bench._run(engine, [1, 2, 3], 1, 8)
    except SystemExit as exc:
        assert "ended early" in str(exc)
    else:
        raise AssertionError("an early end was not reported")


def _ending_params(params):
    def make(**kwargs):
        kwargs["ignore_eos"] = False
        return params(**kwargs, stop_token_ids=list(range(100_000)))

    return make


def test_the_trace_gives_each_cases_device_work_a_step(artifact, monkeypatch):
    """``--trace N``: per case, the kernels a decode step ran, their time and the span, from
    the profiler's windows (here recorded by a stand-in: the CPU runs no kernels, which the
    real recorder says in one line)."""
    bench = load_bench()
    from ninfer_runtime.bench import kernel_profiler
    from ninfer_runtime.engine import Engine

    engine = Engine(str(artifact), backend="cpu", max_lanes=1, max_context=64)
    assert bench.trace(engine, [1, 2, 3], 1, 2, 5) == [
        "kernel trace unavailable: the CPU backend runs no CUDA kernels"
    ]
    windows = {
        "plain": [("gemv", 0.0, 100.0), ("gemv", 100.0, 100.0)],
        "logprobs=5": [("gemv", 0.0, 100.0), ("score_tokens", 150.0, 50.0)],
    }

    def fake_record(work):
        work(lambda name: contextlib.nullcontext())  # the cases run
        return windows

    monkeypatch.setattr(kernel_profiler, "unavailable", lambda runner: None)
    monkeypatch.setattr(kernel_profiler, "record", fake_record)
    lines = bench.trace(engine, [1, 2, 3], 1, 2, 5)
    assert lines[1] == "  plain: 1.0 kernels, 0.100 ms of kernels, span 0.100 ms, idle 0.000 ms"
    assert lines[3].startswith("  logprobs=5: 1.0 kernels, 0.075 ms of kernels, span 0.100 ms")
    assert any("score_tokens" in line and "0.0250 ms" in line for line in lines)
