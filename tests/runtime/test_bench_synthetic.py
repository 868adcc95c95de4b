"""Synthetic artifacts (ninfer-bench synth): valid, bindable, sane values, runnable."""

from __future__ import annotations

import math

import numpy as np
import pytest
from click.testing import CliRunner

from ninfer_format import Artifact
from ninfer_format.verify import verify
from ninfer_runtime.bench.cli import main
from ninfer_runtime.bench.synthetic import plan_synthetic, write_synthetic
from ninfer_runtime.models import load_model
from ninfer_runtime.runner import ModelRunner

CASES = [
    ("tiny_dense", "qwen3_6_27b"),
    ("tiny_dense", "qwen3_6_27b_nvfp4"),
    ("tiny_moe", "qwen3_6_35b_a3b"),
    ("tiny_moe", "qwen3_6_35b_a3b_nvfp4"),
]


@pytest.mark.parametrize(("geometry", "formats"), CASES)
def test_tiny_synthetic_is_valid_and_runs(tmp_path, geometry, formats):
    out = tmp_path / "s.ninfer"
    report = write_synthetic(out, geometry, formats, seed=1)
    assert report.payload_bytes > 0
    with Artifact.open(out) as art:
        assert art.provenance["synthetic"] is True
        assert art.binder_report.ok, art.binder_report.errors
        assert not art.binder_report.warnings, art.binder_report.warnings
        checked = verify(art, strict=True)
        assert checked.ok and not checked.warnings, checked.errors + checked.warnings
        formats_seen = {o.format for o in art.objects.values() if hasattr(o, "format")}
        if formats.endswith("nvfp4"):
            assert "nvfp4" in formats_seen
        plan = plan_synthetic(geometry, formats)
        for name, t in plan.logical.items():
            values = art.parameter(name)
            assert np.isfinite(values).all(), name
            if t.role == "matrix":
                want = 1 / math.sqrt(t.shape[1])
                got = float(np.std(values))
                assert want / 3 < got < want * 3, (name, got, want)
        runner = ModelRunner(load_model(art))
        tokens = np.array([1, 5, 42, 300, 7, 99], dtype=np.int64)
        state = runner.new_state(len(tokens))
        logits = np.asarray(runner.forward([tokens], [state]).logits[0], np.float64)
        assert logits.shape[-1] == 512 and np.isfinite(logits).all()
        assert logits.std() > 0


def test_seed_is_deterministic(tmp_path):
    a, b = tmp_path / "a.ninfer", tmp_path / "b.ninfer"
    write_synthetic(a, "tiny_dense", "qwen3_6_27b", seed=3)
    write_synthetic(b, "tiny_dense", "qwen3_6_27b", seed=3)
    with Artifact.open(a) as x, Artifact.open(b) as y:
        assert x.provenance["checksums"] == y.provenance["checksums"]


@pytest.mark.parametrize(
    ("geometry", "formats", "low", "high"),
    [
        ("qwen3_6_27b", "qwen3_6_27b", 16e9, 18e9),
        ("qwen3_6_27b", "qwen3_6_27b_nvfp4", 16e9, 19e9),
    ],
)
def test_full_geometry_plan_size(geometry, formats, low, high):
    plan = plan_synthetic(geometry, formats)
    assert low < plan.payload_bytes < high
    shapes = {p.members[0].name: p.shape for p in plan.parents}
    assert shapes["text/token_embedding"] == (248320, 5120)
    assert shapes["text/layers/0/mlp/gate"] == (2 * 17408, 5120)


def test_cli_synth(tmp_path):
    out = tmp_path / "c.ninfer"
    result = CliRunner().invoke(
        main, ["synth", "--geometry", "tiny_moe", "--formats", "qwen3_6_35b_a3b", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "MB/s" in result.output and out.exists()
    # not a terminal: the plan and the result, no progress lines
    assert len(result.output.splitlines()) == 2, result.output
    again = CliRunner().invoke(
        main, ["synth", "--geometry", "tiny_moe", "--formats", "qwen3_6_35b_a3b", "-o", str(out)]
    )
    assert again.exit_code == 1, again.output
    assert again.output.strip().endswith(f"{out}: already exists; add --force to replace it")
    assert "Traceback" not in again.output and "overwrite=True" not in again.output


def test_tiny_synthetic_with_mtp_and_proposal_head_speculates(tmp_path):
    out = tmp_path / "p.ninfer"
    write_synthetic(out, "tiny_dense", "qwen3_6_27b", seed=2, proposal_rows=128)
    with Artifact.open(out) as art:
        assert art.binder_report.ok and not art.binder_report.warnings, art.binder_report
        assert art.components["text"].proposal.rows == 128
        assert "mtp" in art.components
        np.testing.assert_array_equal(art.parameter("proposal/token_ids"), np.arange(128))
        model = load_model(art)
        assert model.has_mtp and model.has_proposal_head
        runner = ModelRunner(model)
        pool = runner.new_pool(lanes=2, max_context=32, draft_tokens=3)
        states = [pool.open(32) for _ in range(2)]
        for s, prompt in zip(states, ([1, 5, 42, 300], [7, 99, 3]), strict=True):
            hidden = runner.prefill(np.array(prompt), s).hidden[0]
            runner.mtp_prefill(hidden, np.array(prompt[1:]), s)
        proposal = runner.speculate(states, [11, 12], 3)
        assert proposal.drafts.shape == (2, 3) and proposal.targets.shape == (2, 4)
        assert proposal.drafts.max() < 128  # drafted from the proposal rows only
        runner.commit(states, [list(proposal.drafts[0, :2]), []])
        assert [s.length for s in states] == [4 + 3, 3 + 1]


def test_plan_counts_mtp_and_proposal_bytes():
    plan = plan_synthetic("qwen3_6_27b", "qwen3_6_27b")
    parts = plan.bytes_by_component()
    assert set(parts) == {"text", "mtp", "proposal"}
    assert 0.3e9 < parts["mtp"] < 0.6e9  # one decoder layer plus the input projection, Q8
    assert plan.proposal_rows == 131072
    assert plan.logical["proposal/head"].shape == (131072, 5120)
    bare = plan_synthetic("qwen3_6_27b", "qwen3_6_27b", mtp=False)
    assert set(bare.bytes_by_component()) == {"text"}
    assert bare.payload_bytes + parts["mtp"] + parts["proposal"] <= plan.payload_bytes
    # capped by the vocabulary
    assert plan_synthetic("tiny_dense", "qwen3_6_27b").proposal_rows == 512


def test_cli_plan_only_names_the_mtp_bytes(tmp_path):
    args = ["synth", "--geometry", "qwen3_6_27b", "--formats", "qwen3_6_27b", "--plan-only"]
    result = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "x.ninfer")])
    assert result.exit_code == 0, result.output
    assert "mtp 0.451" in result.output and "proposal 0.357" in result.output, result.output
    bad = CliRunner().invoke(main, [*args, "-o", "x", "--no-mtp", "--proposal-rows", "8"])
    assert bad.exit_code == 2 and "needs the mtp component" in bad.output, bad.output
    big = CliRunner().invoke(main, [*args, "-o", "x", "--proposal-rows", "300000"])
    assert big.exit_code == 2 and "0..248320" in big.output, big.output


def test_cli_unknown_formats_is_a_usage_error():
    args = ["synth", "--geometry", "tiny_dense", "--formats", "nope", "-o", "x", "--plan-only"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "Invalid value for --formats: unknown recipe 'nope'" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_tiny_synthetic_in_gguf_blocks_runs(tmp_path):
    """A GGUF-block artifact (32-value blocks fit the tiny model's 128-wide rows): valid, the
    matrices at the scale the others have, and the engine runs it."""
    from ninfer_convert.recipe import Recipe
    from ninfer_convert.recipes._common import uniform

    out = tmp_path / "g.ninfer"
    write_synthetic(out, "tiny_dense", uniform(Recipe("tiny_gguf", "t"), "gguf_q4_0"), seed=2)
    with Artifact.open(out) as art:
        assert verify(art, strict=True).ok
        assert "gguf_q4_0" in {getattr(o, "format", None) for o in art.objects.values()}
        values = art.parameter("text/layers/0/mlp/down")
        want = 1 / math.sqrt(values.shape[1])
        assert want / 1.5 < float(np.std(values)) < want * 1.5
        runner = ModelRunner(load_model(art))
        logits = runner.forward([np.array([1, 5, 42])], [runner.new_state(3)]).logits[0]
        assert np.isfinite(np.asarray(logits)).all()


@pytest.mark.parametrize("fmt", ["gguf_q4_k", "gguf_q6_k", "gguf_iq2_xxs", "gguf_iq1_m"])
def test_synthetic_gguf_blocks_decode_at_the_matrix_scale(fmt):
    from types import SimpleNamespace

    from ninfer_format.codecs import codec_for
    from ninfer_format.codecs.gguf_blocks import LAYOUT
    from ninfer_runtime.bench.synthetic import parent_chunks

    parent = SimpleNamespace(
        id="p/7", choice=SimpleNamespace(format=fmt), shape=(2, 16, 1024), stacked=()
    )
    raw = np.concatenate(
        [np.asarray(c).reshape(-1).view(np.uint8) for c in parent_chunks(parent, 0)]
    )
    values = codec_for(fmt, LAYOUT).decode(raw, (32, 1024))
    assert np.isfinite(values).all()
    assert 0.7 / 32 < float(np.std(values)) < 1.4 / 32


def test_gguf_q4_k_m_mix_follows_the_more_bits_layers():
    plan = plan_synthetic("qwen3_6_27b", "gguf_q4_k_m")
    fmt = {m.name: p.choice.format for p in plan.parents for m in p.members}
    assert fmt["text/output_head"] == "gguf_q6_k"
    assert fmt["text/token_embedding"] == "gguf_q4_k"
    assert fmt["text/layers/0/gdn/query"] == "gguf_q5_k"
    # downs: layers 0-7 and 56-63, then every third from layer 10
    downs = {i for i in range(64) if fmt[f"text/layers/{i}/mlp/down"] == "gguf_q6_k"}
    assert downs == set(range(8)) | set(range(56, 64)) | set(range(10, 56, 3))
    # values of the 16 attention layers (3, 7, ...): the first and last two, every third between
    values = [i for i in range(3, 64, 4) if fmt[f"text/layers/{i}/attention/value"] == "gguf_q6_k"]
    assert values == [3, 7, 19, 31, 43, 55, 59, 63]
    assert 15.5 * 2**30 < plan.payload_bytes < 16.5 * 2**30
