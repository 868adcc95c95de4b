"""``ninfer --spec mtp``: the same greedy tokens as without, ``--stats``' acceptance line, and
one-line errors for refused speculative options."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from ninfer_convert.pipeline import convert
from ninfer_runtime.cli import main as ninfer_cli
from tests.bundled import BUNDLED

STATS = re.compile(
    r"\[speculative: (?P<accepted>\d+)/(?P<drafted>\d+) drafts accepted \([\d.]+%\), "
    r"(?P<per_round>[\d.]+) tokens per round over (?P<rounds>\d+) rounds, "
    r"by position (?P<positions>(?:\d+% ?)+)\]"
)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    """The bundled model converted with its MTP component and without."""
    root = tmp_path_factory.mktemp("cli_spec")
    paths = {"mtp": root / "tiny.ninfer", "text": root / "text-only.ninfer"}
    convert("qwen3_5_bf16", {"base": str(BUNDLED)}, paths["mtp"])
    convert("qwen3_5_bf16", {"base": str(BUNDLED)}, paths["text"], components=("text",))
    return paths


def ninfer(*args: str):
    return CliRunner().invoke(ninfer_cli, [str(a) for a in args])


def generated_ids(result) -> list[int]:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "prompt", [["--prompt", "What is the capital of Italy?"],
               ["--raw", "--prompt", "Once upon a time", "--max-tokens", "21"]],
    ids=["eos", "max-tokens"],
)  # fmt: skip
def test_greedy_tokens_equal_without_speculation(artifacts, prompt):
    model = artifacts["mtp"]
    plain = ninfer(model, *prompt, "--greedy", "--print-token-ids")
    spec = ninfer(model, *prompt, "--greedy", "--print-token-ids", "--spec", "mtp",
                  "--draft-tokens", "2", "--stats")  # fmt: skip
    assert generated_ids(spec) == generated_ids(plain)
    assert len(generated_ids(plain)) > 4
    stats = STATS.search(spec.stderr)
    assert stats, spec.stderr
    rounds, drafted = int(stats["rounds"]), int(stats["drafted"])
    assert rounds > 0 and drafted == 2 * rounds
    assert float(stats["per_round"]) == pytest.approx(1 + int(stats["accepted"]) / rounds, abs=5e-3)
    assert len(stats["positions"].split()) == 2
    assert "[speculative decoding off]" in ninfer(model, *prompt, "--stats").stderr
    assert "speculative" not in plain.stderr, "without --stats no acceptance line"


def test_speculative_options_are_checked(artifacts):
    model, question = artifacts["mtp"], ("--prompt", "Hi")
    refused = {
        ("--spec", "dflash"): "method 'dflash' is not available yet; use 'mtp' or 'off'",
        ("--spec", "dflash2"): "speculative method 'dflash2' is not available yet",
        ("--spec", "eagle"): "speculative method 'eagle': expected 'mtp' or 'off'",
        ("--spec", "mtp", "--draft-tokens", "6"): "draft_tokens 6: mtp drafts 1..5 tokens",
        ("--draft-tokens", "2"): "--draft-tokens needs --spec mtp",
        ("--proposal-head", "full"): "--proposal-head needs --spec mtp",
    }
    for flags, message in refused.items():
        result = ninfer(model, *question, *flags)
        assert result.exit_code == 2, (flags, result.output)
        one_line = result.output.count("\n") == 1
        assert one_line and result.output.startswith("ninfer: error: "), result.output
        assert message in result.output, (flags, result.output)
    missing = ninfer(artifacts["text"], *question, "--spec", "mtp")
    assert missing.exit_code == 1 and missing.output.count("\n") == 1, missing.output
    assert str(artifacts["text"]) in missing.output and "no mtp component" in missing.output
    assert "Traceback" not in missing.output
