"""``ninfer-bench run --spec mtp``: speculative rounds against the plain step, on the CPU."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ninfer_format import Artifact
from ninfer_runtime.bench import measure as M
from ninfer_runtime.bench.cli import main
from ninfer_runtime.bench.synthetic import write_synthetic
from ninfer_runtime.models import load_model

RUN = ["--backend", "cpu", "--steps", "2", "--prefill", "0"]


@pytest.fixture(scope="module")
def drafting(tmp_path_factory):
    """A tiny synthetic artifact with an MTP component and a 128-row proposal head."""
    path = tmp_path_factory.mktemp("spec") / "p.ninfer"
    write_synthetic(path, "tiny_dense", "qwen3_6_27b", seed=4, proposal_rows=128)
    return path


def test_expected_tokens_per_round():
    assert M.expected_tokens(0.0, 3) == 1
    assert M.expected_tokens(1.0, 3) == 4
    assert M.expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_round_bytes_are_one_verification_and_k_draft_steps(drafting):
    model = load_model(Artifact.open(drafting), "cpu")
    lanes, context, k = 2, 100, 3
    row = M.weight_bytes(model.token_embedding) // model.config.vocab
    draft = M.draft_step_bytes(model, lanes, context)
    verify = M.decode_step_bytes(model, lanes, context) + lanes * k * row  # K+1 rows a lane
    assert M.round_bytes(model, lanes, context, k) == verify + k * draft
    # the full head instead of the proposal rows: the difference of the two heads, K times
    full = M.round_bytes(model, lanes, context, k, optimized=False)
    head_gap = M.weight_bytes(model.output_head) - M.weight_bytes(model.proposal_head)
    assert head_gap > 0 and full - M.round_bytes(model, lanes, context, k) == k * head_gap


def test_spec_run_prints_rounds_with_consistent_numbers(drafting, tmp_path):
    out, record = tmp_path / "rows.json", tmp_path / "perf.md"
    args = [*RUN, "--lanes", "1,2", "--contexts", "24", "--spec", "mtp", "--draft-tokens", "1,3"]
    args += ["--rounds", "2", "--json", str(out), "--record", str(record)]
    result = CliRunner().invoke(main, ["run", str(drafting), *args])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "ms/round" in line)
    for column in ("K", "ms/step", "ratio", "GB/round", "floor ms", "% floor", "plain tok/s"):
        assert column in header.split() or column in header, column
    assert [f"a={a:g}" in header for a in M.ACCEPTANCE_RATES] == [True] * 5, header
    rows = json.loads(out.read_text())
    plain = {(r["lanes"], r["context"]): r for r in rows if r["kind"] == "decode"}
    spec = [r for r in rows if r["kind"] == "spec"]
    assert [(r["lanes"], r["draft_tokens"]) for r in spec] == [(1, 1), (1, 3), (2, 1), (2, 3)]
    for r in spec:
        n, k, seconds = r["lanes"], r["draft_tokens"], r["round_ms"] / 1e3
        assert r["step_ms"] == plain[n, 24]["step_ms"]  # the plain step measured above
        assert r["ratio"] == pytest.approx(r["round_ms"] / r["step_ms"])
        assert r["percent_of_floor"] == pytest.approx(100 * r["floor_ms"] / r["round_ms"])
        at, speedup = r["tokens_per_s_at"], r["speedup_at"]
        assert list(at) == ["0", "0.5", "0.68", "0.8", "1"]
        assert at["0"] == pytest.approx(n / seconds)
        assert at["1"] == pytest.approx(n * (k + 1) / seconds)
        assert at["0.68"] == pytest.approx(n * sum(0.68**j for j in range(k + 1)) / seconds)
        assert r["plain_tokens_per_s"] == pytest.approx(plain[n, 24]["tokens_per_s"])
        for a, tok_s in at.items():
            assert speedup[a] == pytest.approx(tok_s / r["plain_tokens_per_s"])
    draft = [r for r in rows if r["kind"] == "draft"]
    assert [r["lanes"] for r in draft] == [1, 2]
    for r in draft:
        assert r["proposal_rows"] == 128 and r["optimized_ms"] > 0 and r["full_ms"] > 0
        assert r["full_bytes"] > r["optimized_bytes"]
    assert "proposal rows (optimized) vs full vocabulary" in result.output
    text = record.read_text()
    assert "| lanes | context | K | ms/step | ms/round | ratio |" in text
    assert text.count("\n| 2 | 24 | 3 | ") == 1 and "| optimized ms |" in text


def test_measured_acceptance_through_the_engine(drafting, tmp_path):
    out = tmp_path / "rows.json"
    args = [*RUN, "--lanes", "1", "--contexts", "8", "--spec", "mtp", "--draft-tokens", "2"]
    args += ["--rounds", "1", "--measure-acceptance", "--answer-tokens", "12", "--json", str(out)]
    result = CliRunner().invoke(main, ["run", str(drafting), *args])
    assert result.exit_code == 0, result.output
    assert f"measured on {len(M.DEMO_PROMPTS)} demo prompts" in result.output
    measured = [r for r in json.loads(out.read_text()) if r["kind"] == "acceptance"]
    assert len(measured) == 1
    r = measured[0]
    assert r["draft_tokens"] == 2 and 0 < r["tokens"] <= 12 * len(M.DEMO_PROMPTS)
    assert r["same_tokens"] is True  # greedy output does not change with speculation
    assert r["tokens_per_round"] == pytest.approx(1 + 2 * r["acceptance"])
    assert r["speedup"] == pytest.approx(r["tokens_per_s"] / r["plain_tokens_per_s"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--draft-tokens", "2"], "--draft-tokens needs --spec mtp"),
        (["--measure-acceptance"], "--measure-acceptance needs --spec mtp"),
        (["--spec", "mtp", "--draft-tokens", "6"], "draft_tokens 6: mtp drafts 1..5"),
        (["--spec", "dflash"], "'dflash' is not available yet"),
    ],
)
def test_bad_spec_options_are_usage_errors(drafting, extra, message):
    result = CliRunner().invoke(main, ["run", str(drafting), *RUN, *extra])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_spec_on_an_artifact_without_mtp_names_it(tmp_path):
    path = tmp_path / "bare.ninfer"
    write_synthetic(path, "tiny_dense", "qwen3_6_27b", mtp=False)
    result = CliRunner().invoke(main, ["run", str(path), *RUN, "--spec", "mtp"])
    assert result.exit_code == 1, result.output
    assert result.output.strip() == (
        f"Error: {path}: the artifact has no mtp component; --spec mtp needs one "
        "(ninfer-bench synth writes it unless --no-mtp)"
    )
