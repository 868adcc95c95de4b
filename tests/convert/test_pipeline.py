"""End-to-end conversion of tiny transformers checkpoints with the shipped recipes."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from ninfer_convert.cli import main as convert_cli
from ninfer_convert.errors import ConvertError, RecipeError, SourceError
from ninfer_convert.pipeline import convert
from ninfer_convert.recipe import available_recipes
from ninfer_convert.verify import verify_against_source
from ninfer_format import Artifact
from ninfer_format.verify import verify

DENSE_RECIPES = [
    "qwen3_5_bf16",
    "qwen3_6_27b",
    "qwen3_8_27b",
    "tiny_q4",
    "tiny_q5",
    "tiny_q6",
    "tiny_q8",
    "tiny_nf4",
    "tiny_nvfp4",
    "tiny_fp8",
    "tiny_mixed",
]
MOE_RECIPES = ["qwen3_5_moe_bf16", "qwen3_6_35b_a3b", "tiny_mixed", "tiny_nvfp4"]


def check_artifact(path, checkpoint):
    with Artifact.open(path) as art:
        assert art.binder_report.ok, art.binder_report.errors
        assert not art.binder_report.warnings, art.binder_report.warnings
        report = verify(art, strict=True)
        assert report.ok and not report.warnings, report.errors + report.warnings
        assert art.resource("generation_config.json")
    result = verify_against_source(path, {"base": str(checkpoint)})
    assert result["errors"] == []
    return result


@pytest.mark.parametrize("recipe", DENSE_RECIPES)
def test_dense_recipes(tmp_path, tiny_dense, recipe):
    out = tmp_path / f"{recipe}.ninfer"
    report = convert(recipe, {"base": str(tiny_dense)}, out)
    result = check_artifact(out, tiny_dense)
    assert {"text", "mtp"} == set(Artifact.open(out).components)
    assert len(result["parameters"]) == len(report.parameters) > 60
    saved = json.loads(out.with_name(out.name + ".conversion.json").read_text())
    assert saved["recipe"] == recipe and saved["parameters"]


@pytest.mark.parametrize("recipe", MOE_RECIPES)
def test_moe_recipes(tmp_path, tiny_moe, recipe):
    out = tmp_path / f"{recipe}.ninfer"
    convert(recipe, {"base": str(tiny_moe)}, out)
    check_artifact(out, tiny_moe)


def test_bf16_is_lossless_and_mapping_is_the_spec(tmp_path, tiny_dense):
    out = tmp_path / "m.ninfer"
    convert("qwen3_5_bf16", {"base": str(tiny_dense)}, out)
    sd = load_file(tiny_dense / "model.safetensors")
    with Artifact.open(out) as art:
        q_proj = sd["model.layers.1.self_attn.q_proj.weight"].view(2, 2, 64, 128)
        bf = lambda t: t.to(torch.bfloat16).float().numpy()  # noqa: E731
        query = art.parameter("text/layers/1/attention/query")
        gate = art.parameter("text/layers/1/attention/gate")
        np.testing.assert_array_equal(query, bf(q_proj[:, 0].reshape(128, 128)))
        np.testing.assert_array_equal(gate, bf(q_proj[:, 1].reshape(128, 128)))
        conv = sd["model.layers.0.linear_attn.conv1d.weight"]
        np.testing.assert_array_equal(
            art.parameter("text/layers/0/gdn/convolution"), bf(conv[:, 0, :].t())
        )
        qkv = sd["model.layers.0.linear_attn.in_proj_qkv.weight"]
        np.testing.assert_array_equal(art.parameter("text/layers/0/gdn/value"), bf(qkv[128:]))
        a_log = art.parameter("text/layers/0/gdn/a_log")
        assert a_log.dtype == np.float32
        np.testing.assert_array_equal(a_log, sd["model.layers.0.linear_attn.A_log"].numpy())
        np.testing.assert_array_equal(
            art.parameter("mtp/input_projection"), bf(sd["mtp.fc.weight"])
        )
        # one packed parent holds attention query, key, gate and value
        parents = {
            art.bindings[f"text/layers/1/attention/{s}"].parts[0].object
            for s in ("query", "key", "gate", "value")
        }
        assert len(parents) == 1


def test_dense_groupwise_packing(tmp_path, tiny_dense):
    out = tmp_path / "m.ninfer"
    convert("qwen3_6_27b", {"base": str(tiny_dense)}, out)
    with Artifact.open(out) as art:

        def parent(name):
            b = art.bindings[name]
            return art.objects[b.object if hasattr(b, "object") else b.parts[0].object]

        qk = parent("text/layers/1/attention/query")
        assert qk is parent("text/layers/1/attention/key") and qk.format == "q4_g64_fp16"
        gv = parent("text/layers/1/attention/gate")
        assert gv is parent("text/layers/1/attention/value") and gv.format == "q5_g64_fp16"
        assert parent("text/layers/0/gdn/a_projection").format == "bf16"
        assert parent("text/layers/0/gdn/a_projection") is not parent(
            "text/layers/0/gdn/b_projection"
        )
        assert parent("text/output_head").format == "q6_g64_fp16"
        assert parent("mtp/input_projection").format == "q8_g32_fp16"


def test_fused_experts_and_vlm_prefix_give_the_same_values(tmp_path, tiny_moe):
    fused = tmp_path / "fused"
    fused.mkdir()
    sd = load_file(tiny_moe / "model.safetensors")
    out = {}
    for name, value in sd.items():
        if ".mlp.experts." in name:
            continue
        new = (
            name.replace("model.", "model.language_model.", 1)
            if name.startswith("model.")
            else name
        )
        out[new] = value
    for prefix in sorted({n.split("mlp.experts.")[0] for n in sd if ".mlp.experts." in n}):
        gate_up = [
            torch.cat(
                [
                    sd[f"{prefix}mlp.experts.{e}.gate_proj.weight"],
                    sd[f"{prefix}mlp.experts.{e}.up_proj.weight"],
                ]
            )
            for e in range(4)
        ]
        down = [sd[f"{prefix}mlp.experts.{e}.down_proj.weight"] for e in range(4)]
        p = (
            prefix.replace("model.", "model.language_model.", 1)
            if prefix.startswith("model.")
            else prefix
        )
        out[p + "mlp.experts.gate_up_proj"] = torch.stack(gate_up)
        out[p + "mlp.experts.down_proj"] = torch.stack(down)
    save_file(out, fused / "model.safetensors", metadata={"format": "pt"})
    for name in ("config.json", "generation_config.json"):
        (fused / name).write_bytes((tiny_moe / name).read_bytes())
    a, b = tmp_path / "a.ninfer", tmp_path / "b.ninfer"
    convert("qwen3_5_moe_bf16", {"base": str(tiny_moe)}, a)
    convert("qwen3_5_moe_bf16", {"base": str(fused)}, b)
    with Artifact.open(a) as x, Artifact.open(b) as y:
        assert set(x.bindings) == set(y.bindings)
        for name in x.bindings:
            np.testing.assert_array_equal(x.parameter(name), y.parameter(name))


def test_tied_embeddings_share_one_object(tmp_path, tiny_dense):
    tied = tmp_path / "tied"
    tied.mkdir()
    sd = load_file(tiny_dense / "model.safetensors")
    del sd["lm_head.weight"]
    save_file(sd, tied / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tiny_dense / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (tied / "config.json").write_text(json.dumps(config))
    out = tmp_path / "t.ninfer"
    convert("qwen3_5_bf16", {"base": str(tied)}, out)
    with Artifact.open(out) as art:
        assert art.bindings["text/output_head"] == art.bindings["text/token_embedding"]
        assert art.binder_report.ok


def test_errors_are_clear(tmp_path, tiny_dense):
    with pytest.raises(RecipeError, match="unknown recipe 'nope'"):
        convert("nope", {"base": str(tiny_dense)}, tmp_path / "x.ninfer")
    with pytest.raises(SourceError):
        convert("qwen3_5_bf16", {"base": str(tmp_path / "missing")}, tmp_path / "x.ninfer")
    broken = tmp_path / "broken"
    broken.mkdir()
    sd = load_file(tiny_dense / "model.safetensors")
    del sd["model.layers.2.linear_attn.in_proj_z.weight"]
    save_file(sd, broken / "model.safetensors", metadata={"format": "pt"})
    (broken / "config.json").write_bytes((tiny_dense / "config.json").read_bytes())
    with pytest.raises(SourceError, match=r"in_proj_z.*text/layers/2/gdn/z"):
        convert("qwen3_5_bf16", {"base": str(broken)}, tmp_path / "x.ninfer")
    no_mtp = tmp_path / "no_mtp"
    no_mtp.mkdir()
    save_file(
        {k: v for k, v in sd.items() if not k.startswith("mtp.")},
        no_mtp / "model.safetensors",
        metadata={"format": "pt"},
    )
    (no_mtp / "config.json").write_bytes((tiny_dense / "config.json").read_bytes())
    with pytest.raises(SourceError, match="no mtp"):
        convert(
            "qwen3_5_bf16", {"base": str(no_mtp)}, tmp_path / "x.ninfer", components=("text", "mtp")
        )
    assert list(tmp_path.glob("*.ninfer*")) == []


def test_failure_midway_leaves_no_artifact(tmp_path, tiny_dense, monkeypatch):
    import ninfer_convert.parents as parents

    calls = {"n": 0}
    real = parents.quantize

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 20:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(parents, "quantize", flaky)
    with pytest.raises(KeyboardInterrupt):
        convert("tiny_q4", {"base": str(tiny_dense)}, tmp_path / "x.ninfer")
    assert list(tmp_path.iterdir()) == []


def test_cli_convert_list_and_verify(tmp_path, tiny_dense):
    runner = CliRunner()
    listed = runner.invoke(convert_cli, ["--list-recipes"])
    assert listed.exit_code == 0
    for name in available_recipes():
        assert name in listed.output
    out = tmp_path / "m.ninfer"
    result = runner.invoke(
        convert_cli, ["--recipe", "tiny_mixed", "--source", str(tiny_dense), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "bits/weight" in result.output and "rmse" in result.output
    again = runner.invoke(
        convert_cli,
        ["--recipe", "tiny_mixed", "--source", str(tiny_dense), "-o", str(out), "--quiet"],
    )
    assert again.exit_code == 1 and "already exists" in again.output
    checked = runner.invoke(convert_cli, ["verify", str(out), "--source", str(tiny_dense)])
    assert checked.exit_code == 0, checked.output
    assert checked.output.strip().endswith("ok")
    missing = runner.invoke(convert_cli, ["--recipe", "tiny_mixed", "-o", str(out)])
    assert missing.exit_code == 2


def test_sharded_output(tmp_path, tiny_dense):
    out = tmp_path / "m.ninfer"
    convert("qwen3_5_bf16", {"base": str(tiny_dense)}, out, shard_limit=1 << 20)
    parts = sorted(tmp_path.glob("m.ninfer.part-*"))
    assert len(parts) >= 2
    check_artifact(out, tiny_dense)


def test_convert_error_type_is_shared():
    assert issubclass(RecipeError, ConvertError) and issubclass(SourceError, ConvertError)
