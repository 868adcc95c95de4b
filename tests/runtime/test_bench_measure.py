"""The measuring half of ninfer-bench, on the CPU backend and tiny synthetic artifacts."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ninfer_format import Artifact
from ninfer_runtime.bench import measure as M
from ninfer_runtime.bench.cli import main
from ninfer_runtime.bench.synthetic import write_synthetic
from ninfer_runtime.models import load_model
from ninfer_runtime.state import ContextPool


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = {}
    for geometry, formats in (("tiny_dense", "qwen3_6_27b"), ("tiny_moe", "qwen3_6_35b_a3b")):
        path = tmp_path_factory.mktemp(geometry) / "s.ninfer"
        write_synthetic(path, geometry, formats, seed=2)
        out[geometry] = path
    return out


def test_step_bytes_count_weights_once_and_context_per_lane(artifacts):
    model = load_model(Artifact.open(artifacts["tiny_dense"]), "cpu")
    specs, _ = model.state_specs()
    per_token = ContextPool.page_bytes_of(specs, None, 1)
    one = M.decode_step_bytes(model, 1, 100)
    assert M.decode_step_bytes(model, 1, 300) - one == 200 * per_token
    # a second lane adds its context, its states and one embedding row, not the weights again
    two = M.decode_step_bytes(model, 2, 100)
    row = M.weight_bytes(model.token_embedding) // model.config.vocab
    states = ContextPool.slot_bytes_of(specs)
    assert two - one == 100 * per_token + 2 * states + row
    assert one > M.weight_bytes(model.output_head)


def test_moe_bytes_grow_with_the_experts_a_batch_touches(artifacts):
    model = load_model(Artifact.open(artifacts["tiny_moe"]), "cpu")
    m = next(layer.ffn.weights for layer in model.layers)
    expert = sum(M.weight_bytes(w) for w in vars(m.experts[0]).values())
    one, eight = M.decode_step_bytes(model, 1, 0), M.decode_step_bytes(model, 8, 0)
    specs, _ = model.state_specs()
    per_lane = 2 * ContextPool.slot_bytes_of(specs) + (
        M.weight_bytes(model.token_embedding) // model.config.vocab
    )
    extra_experts = (eight - one - 7 * per_lane) / (len(model.layers) * expert)
    e, k = len(m.experts), m.top_k
    expected = e * (1 - (1 - k / e) ** 8) - k
    assert extra_experts == pytest.approx(expected, abs=0.2)


def test_run_prints_a_table_and_writes_rows(artifacts, tmp_path):
    out = tmp_path / "rows.json"
    args = "--backend cpu --lanes 1,3 --contexts 40 --steps 2 --prefill 70 --chunk 32 --profile 2"
    result = CliRunner().invoke(
        main, ["run", str(artifacts["tiny_moe"]), *args.split(), "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "% floor" in result.output and "prefill 70 tokens" in result.output
    rows = json.loads(out.read_text())
    decode = [r for r in rows if r["kind"] == "decode"]
    assert [(r["lanes"], r["context"]) for r in decode] == [(1, 40), (3, 40)]
    for r in decode:
        assert r["tokens_per_s"] == pytest.approx(r["lanes"] * 1e3 / r["step_ms"])
        assert r["percent_of_floor"] == pytest.approx(100 * r["floor_ms"] / r["step_ms"])
    profile = next(r for r in rows if r["kind"] == "profile")
    assert set(M.PROFILED_OPS) <= set(profile) and profile["step"] > 0


def test_bad_lane_list_is_a_usage_error(artifacts):
    result = CliRunner().invoke(main, ["run", str(artifacts["tiny_dense"]), "--lanes", "1,x"])
    assert result.exit_code == 2 and "comma-separated positive integers" in result.output
