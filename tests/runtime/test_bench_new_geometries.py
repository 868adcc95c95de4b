"""ninfer-bench for Qwen4Exp and GLM5Next: the official geometries' numbers, synthetic artifacts
cut to fewer layers at full width (valid, every kind of layer kept, shapes as the whole
model's), and a CPU run that prints per-layer times and the extrapolated whole-model step."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from ninfer_format import Artifact
from ninfer_format.binders.glm5_next_geometry import Glm5NextGeometry
from ninfer_format.binders.qwen4_exp_geometry import Qwen4ExpGeometry
from ninfer_format.verify import verify
from ninfer_runtime.bench.active_bytes import ActiveWeights
from ninfer_runtime.bench.architectures import architecture_of, extrapolate, kept_layers
from ninfer_runtime.bench.cli import main
from ninfer_runtime.bench.geometries import GEOMETRIES
from ninfer_runtime.bench.synthetic import plan_synthetic, write_synthetic
from ninfer_runtime.expert_offload.stream_window import STREAM_CHUNK

CASES = {
    "qwen4_exp": ("tiny_qwen4_exp", "qwen3_8_flash_next", 3),
    "glm5_next": ("tiny_glm5_next", "glm5next", 3),
}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_new")
    out = {}
    for key, (geometry, formats, layers) in CASES.items():
        path = root / f"{key}.ninfer"
        write_synthetic(path, geometry, formats, seed=2, layers=layers, ple_rows_scale=0.5)
        out[key] = path
    return out


def test_official_geometries_have_the_published_numbers():
    q = Qwen4ExpGeometry.from_config(GEOMETRIES["qwen3_8_flash_next"])
    assert q.layers == 48 and q.layer_types.count("linear_attention") == 36
    assert (q.hidden, q.moe.experts, q.moe.top_k, q.moe.expert_width) == (2560, 512, 10, 640)
    assert q.ple is not None and q.ple.layers == (1,)
    # the published n-gram table: 320,001,536 rows of 160 columns (51 B parameters)
    assert (q.ple.table_rows(1), q.ple.head_dim) == (320_001_536, 160)
    g = Glm5NextGeometry.from_config(GEOMETRIES["glm5next"])
    assert g.layers == 45 and g.layer_types.count("linear_attention") == 34
    assert g.mlp_types.count("dense") == 3 and (g.moe.experts, g.moe.top_k) == (288, 8)


def test_kept_layers_keep_every_kind_in_model_order():
    kinds = ["gdn", "gdn+ple", "gdn", "qsa", "gdn", "gdn", "gdn", "qsa"]
    assert kept_layers(kinds, 3) == [0, 1, 3]
    assert kept_layers(kinds, 5) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="at least 3"):
        kept_layers(kinds, 2)


def test_extrapolation_replaces_the_kept_layers_by_the_whole_models():
    means, whole = extrapolate(10.0, [2.0, 4.0, 3.0], ["a", "b", "a"], {"a": 10, "b": 2})
    assert means == {"a": 2.5, "b": 4.0}
    assert whole == pytest.approx(10.0 - 9.0 + 25.0 + 8.0)


def test_synth_says_what_it_keeps_and_refuses_too_few_layers():
    args = ["synth", "--geometry", "tiny_qwen4_exp", "--formats", "qwen4_exp_bf16", "--plan-only"]
    args += ["-o", "x"]
    result = CliRunner().invoke(main, [*args, "--layers", "4", "--ple-rows-scale", "0.5"])
    assert result.exit_code == 0, result.output
    assert "layers kept: [0, 1, 2, 3]" in result.output and "of 8" in result.output
    assert "n-gram (PLE) tables at 0.5 of their rows" in result.output
    assert "no mtp component" in result.output
    few = CliRunner().invoke(main, [*args, "--layers", "2"])
    assert few.exit_code != 0 and "--layers 2 cannot keep every kind of layer" in few.output


def test_reduced_plan_sizes_the_whole_model():
    whole = plan_synthetic("tiny_glm5_next", "glm5next")
    cut = plan_synthetic("tiny_glm5_next", "glm5next", layers=3)
    assert cut.reduction["whole_bytes"]["weights"] == whole.bytes_by_component()["text"]
    # what the text model loads beside its own layers (the MTP block, the proposal head) is
    # counted once, unscaled: a reduced budget must hold it as the whole model's does
    whole = plan_synthetic("tiny_moe", "qwen3_6_35b_a3b")
    cut = plan_synthetic("tiny_moe", "qwen3_6_35b_a3b", layers=2)
    sizes = whole.bytes_by_component()
    assert sizes["mtp"] > 0 and sizes["proposal"] > 0
    assert cut.reduction["whole_bytes"]["others"] == sizes["mtp"] + sizes["proposal"]


@pytest.mark.parametrize("key", sorted(CASES))
def test_reduced_artifact_is_valid_with_the_whole_models_layer_shapes(artifacts, key):
    geometry, _, layers = CASES[key]
    with Artifact.open(artifacts[key]) as art:
        assert art.binder_report.ok, art.binder_report.errors
        checked = verify(art, strict=True)
        assert checked.ok, checked.errors
        reduced = art.provenance["reduced"]
        assert len(reduced["kept"]) == layers
        config = art.components["text"].config
        arch = architecture_of(config)
        assert set(reduced["kinds"]) == set(arch.kinds(arch.read(GEOMETRIES[geometry])))
        whole = {s.name: s.shape for s in arch.parameters(GEOMETRIES[geometry], ("text",), None)}
        shapes = art.binder_report.parameters
        compared = 0
        for k, i in enumerate(reduced["kept"]):
            for name, shape in shapes.items():
                if name.startswith(f"text/layers/{k}/") and "ngram_table" not in name:
                    original = name.replace(f"text/layers/{k}/", f"text/layers/{i}/", 1)
                    assert shape == whole[original], name
                    compared += 1
        assert compared > 20
        if key == "qwen4_exp":  # the n-gram table at half its rows, said in provenance
            table = next(n for n in shapes if n.endswith("ngram_table"))
            full = next(n for n in whole if n.endswith("ngram_table"))
            assert shapes[table][0] < 0.6 * whole[full][0]
            assert reduced["ple_rows_scale"] == 0.5
            values = art.parameter(table)
            assert np.isfinite(values).all()


def test_a_step_reads_its_routed_experts_and_gathered_rows_only(artifacts):
    with Artifact.open(artifacts["qwen4_exp"]) as art:
        w = ActiveWeights(art)
        kinds = art.provenance["reduced"]["kinds"]
        plain = kinds.index("gdn/moe")
        experts = w.experts[plain]
        mean = sum(experts.values()) / len(experts)
        assert w.layer(plain, 1) == int(w.whole[plain] + w.top_k * mean)  # one row: top_k
        assert w.layer(plain, 10**6) == int(w.whole[plain] + sum(experts.values()))
        ple = kinds.index("gdn+ple/moe")
        table = next(n for n in art.bindings if n.endswith("ngram_table"))
        rows = art.binder_report.parameters[table][0]
        config = art.components["text"].config
        heads = (config["ngram_size"] - 1) * config["heads_per_ngram"]
        assert w.row[ple] == heads * (art.objects[art.bindings[table].object].bytes // rows)
        assert w.flops(3) == 3 * w.flops(1) > 0


@pytest.mark.parametrize("key", sorted(CASES))
def test_cpu_run_prints_layer_times_and_the_extrapolated_step(artifacts, key, tmp_path):
    args = ["run", str(artifacts[key]), "--backend", "cpu", "--lanes", "1", "--contexts", "16"]
    record = tmp_path / "record.md"
    args += ["--steps", "2", "--prefill", "0", "--record", str(record)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "per layer, measured (ms/step)" in result.output
    line = next(x for x in result.output.splitlines() if "EXTRAPOLATED from the layers" in x)
    assert "whole model (8 layers)" in line and "floor" in line
    assert "whole-model ms/step (extrapolated)" in record.read_text()


NUMBER = r"[\d.]+(?:e[-+]\d+)?"


def test_vram_budget_keeps_the_whole_models_share_on_the_host(artifacts, tmp_path):
    """The plan, then beside each measurement what the host computed and read against the
    host's read floor, and what prefill streamed (the CPU backend has no upload floor)."""
    record = tmp_path / "record.md"
    args = ["run", str(artifacts["glm5_next"]), "--backend", "cpu", "--lanes", "1"]
    args += ["--contexts", "16", "--steps", "2", "--prefill", "64", "--chunk", "64"]
    args += ["--vram-budget", "1MiB", "--record", str(record)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "keeps 0.0% of its routed experts in device memory" in result.output
    assert "routed experts in device memory (0%" in result.output  # the plan's summary
    assert re.search(r"host read [\d.]+ GB/s on \d+ threads\n", result.output)
    decode = re.search(
        rf"offload, 1 lane\(s\), context 16: host pairs 100%; host read ({NUMBER}) MB a step "
        rf"\(floor ({NUMBER}) ms\), the device waited ({NUMBER}) ms; streamed 0 MB a step\n",
        result.output,
    )
    assert decode and float(decode[1]) > 0 and float(decode[2]) > 0 and float(decode[3]) > 0
    prefill = re.search(
        r"offload, prefill of 64 tokens, a step = the prompt: host pairs 0%; host read 0 MB "
        rf"a step \(floor 0 ms\), the device waited 0 ms; streamed ({NUMBER}) MB a step\n",
        result.output,
    )
    assert prefill and float(prefill[1]) > 0  # 64 rows a call: every host expert streamed
    # prefill takes the engine's chunk under this budget, not --chunk
    assert f"prefill 64 tokens (chunk {STREAM_CHUNK})" in result.output
    assert decode[0].strip() + "." in record.read_text()


def test_mapped_decode_says_what_it_read_in_place(artifacts):
    """``--expert-stream-decode mapped``: decode computes nothing on the host, and the row
    says the bytes the device read in place a step, counted on the device (the CPU backend
    has no upload floor: none is said)."""
    args = ["run", str(artifacts["glm5_next"]), "--backend", "cpu", "--lanes", "1"]
    args += ["--contexts", "16", "--steps", "2", "--prefill", "0", "--vram-budget", "1MiB"]
    result = CliRunner().invoke(main, [*args, "--expert-stream-decode", "mapped"])
    assert result.exit_code == 0, result.output
    decode = re.search(
        r"offload, 1 lane\(s\), context 16: host pairs 0%; host read 0 MB a step \(floor 0 "
        rf"ms\), the device waited 0 ms; streamed 0 MB a step; read in place ({NUMBER}) MB a "
        r"step\n",
        result.output,
    )
    assert decode and float(decode[1]) > 0, result.output


def test_ple_rows_resident_or_streamed_and_what_streaming_read(artifacts):
    """``--ple-rows`` picks where Qwen4Exp's n-gram tables are read from; streamed, each row
    says what a step looked up and read from the artifact; another model refuses it."""
    args = ["run", str(artifacts["qwen4_exp"]), "--backend", "cpu", "--lanes", "1"]
    args += ["--contexts", "16", "--steps", "2", "--prefill", "32", "--chunk", "32"]
    resident = CliRunner().invoke(main, [*args, "--ple-rows", "resident"])
    assert resident.exit_code == 0, resident.output
    assert "PLE n-gram tables: resident" in resident.output
    assert "PLE rows," not in resident.output
    streamed = CliRunner().invoke(main, [*args, "--ple-rows", "streamed"])
    assert streamed.exit_code == 0, streamed.output
    assert "PLE n-gram tables: streamed from the artifact through a 256 MiB row cache" in (
        streamed.output
    )
    with Artifact.open(artifacts["qwen4_exp"]) as art:
        config = art.components["text"].config
    # a token's rows: every n-gram order's heads on each PLE layer (fewer where hashes meet)
    per_token = (config["ngram_size"] - 1) * config["heads_per_ngram"]
    per_token *= len(config["ple_layer_ids"])
    decode = re.search(
        rf"PLE rows, 1 lane\(s\), context 16: ({NUMBER}) looked up a step, (\d+)% held by "
        rf"the cache; ({NUMBER}) MB read from the artifact a step in ({NUMBER}) ranges\n",
        streamed.output,
    )
    assert decode and 0 < float(decode[1]) <= per_token
    prefill = re.search(
        rf"PLE rows, prefill of 32 tokens, a step = the prompt: ({NUMBER}) looked up a step, "
        rf"(\d+)% held by the cache; ({NUMBER}) MB read from the artifact a step",
        streamed.output,
    )
    # the prompt read twice: its second reading finds the first one's rows in the cache
    assert prefill and float(prefill[1]) > per_token and 40 <= int(prefill[2]) < 100
    assert float(prefill[3]) > 0
    glm = ["run", str(artifacts["glm5_next"]), "--backend", "cpu", "--lanes", "1"]
    refused = CliRunner().invoke(main, [*glm, "--prefill", "0", "--ple-rows", "resident"])
    assert refused.exit_code != 0 and "ple_rows" in refused.output
    assert "Traceback" not in refused.output


class PlannedGpu:
    """What the budget's scaling asks of a GPU backend: its workspace (a fixed size here,
    asked with decode graphs off, as the plan counts it with experts on the host) and
    whether it prefetches (two prefill windows)."""

    def __init__(self, workspace: int):
        self.workspace, self.graphs = workspace, True
        self.asked_with_graphs: list[bool] = []

    def device_workspace(self, config, rows, logit_rows) -> int:
        self.asked_with_graphs.append(self.graphs)
        return self.workspace

    def prefetch_experts(self, artifact, groups) -> None:
        pass


def test_a_reduced_artifacts_budget_sets_the_workspace_beside_both_shares(artifacts):
    """The whole model's share of experts is what its budget holds beside its weights and
    the plan's workspace and windows; the reduced artifact gets its own weights, the same
    workspace and windows at its budget, and that share of its experts."""
    from ninfer_runtime.bench.cli_load import _scaled_budget
    from ninfer_runtime.expert_offload.plan import WeightSizes, stored_bytes
    from ninfer_runtime.expert_offload.stream_window import default_window

    opened = Artifact.open(artifacts["glm5_next"])
    reduced = opened.provenance["reduced"]
    whole = reduced["whole_bytes"]
    names = [n for n in opened.bindings if not n.startswith("vision/") and "ngram" not in n]
    sizes = WeightSizes.measure(opened, names)
    tables = sum(stored_bytes(opened, n) for n in opened.bindings if "ngram_table" in n)
    whole_other = whole["weights"] + whole.get("others", 0) - whole["experts"] - tables
    workspace = 5 << 20
    given = whole_other + workspace + whole["experts"] // 2  # about half, beside the windows
    backend = PlannedGpu(workspace)
    budget, most, note = _scaled_budget(opened, str(given), reduced, backend, 64)
    assert backend.graphs and backend.asked_with_graphs == [False] * len(backend.asked_with_graphs)
    assert backend.asked_with_graphs

    def windows(b: int) -> int:
        return 2 * default_window(sizes.experts, b)

    share = (given - whole_other - workspace - windows(given)) / whole["experts"]
    assert 0 < share < 0.5
    want = sizes.other + workspace + windows(budget) + share * sizes.expert_total
    assert abs(budget - want) <= 2
    assert f"keeps {100 * share:.1f}% of its routed experts" in note
    assert most is not None and abs(most - share) < 1e-9  # and keeps no more than that share
    # a budget that holds every expert beside the workspace is passed on as it is
    roomy = given + whole["experts"]
    assert _scaled_budget(opened, str(roomy), reduced, PlannedGpu(workspace), 64)[:2] == (
        roomy,
        None,
    )


def test_glm5_next_profile_takes_out_its_own_ops(artifacts, tmp_path):
    """``--profile``'s ablation of a GLM5Next step takes out its Kimi Delta Attention, latent
    attention and routed experts, and not the ops it never runs (Gated DeltaNet's)."""
    out = tmp_path / "rows.json"
    args = ["run", str(artifacts["glm5_next"]), "--backend", "cpu", "--lanes", "1"]
    args += ["--contexts", "16", "--steps", "2", "--prefill", "0", "--profile", "1"]
    result = CliRunner().invoke(main, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    profile = next(r for r in json.loads(out.read_text()) if r["kind"] == "profile")
    assert {"kda_decode", "latent_attention", "routed_experts", "linear", "rest"} <= set(profile)
    assert "gdn_decode" not in profile and "attention_decode" not in profile
