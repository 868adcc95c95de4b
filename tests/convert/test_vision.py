"""Vision pass-through: a tiny VLM-layout checkpoint (``model.language_model.*`` and
``model.visual.*``) converts into an artifact whose ``vision`` component the binder checks
(spec 2.3, 5.1, 5.4, 5.7).

The VLM checkpoint reuses the session's tiny text checkpoint (MTP included) under the VLM prefix,
so the text parameters of both conversions must be identical. The expected vision values are
computed here from the HF tensors with their own name map, independently of the adapter's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from ninfer_convert.cli import main as convert_cli
from ninfer_convert.errors import SourceError
from ninfer_convert.pipeline import ProposalRequest, convert
from ninfer_convert.verify import verify_against_source
from ninfer_format import Artifact
from ninfer_format.verify import verify
from tests.tiny_checkpoints import COMMON, randomize

VISION = dict(
    depth=2,
    hidden_size=64,
    intermediate_size=80,
    num_heads=2,
    patch_size=4,
    temporal_patch_size=2,
    spatial_merge_size=2,
    num_position_embeddings=16,
    out_hidden_size=COMMON["hidden_size"],
)
PROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "patch_size": 4,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
TEXT_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
TEXT_FILES += ("generation_config.json",)
RECIPES = ("qwen3_5_bf16", "qwen3_6_27b")


def _vlm_model(moe: bool) -> torch.nn.Module:
    """A fresh VLM whose text config equals the one ``tests.tiny_checkpoints.build`` uses."""
    import transformers as t

    if moe:
        experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128)
        text = t.Qwen3_5MoeTextConfig(shared_expert_intermediate_size=128, **experts, **COMMON)
        vision = t.Qwen3_5MoeVisionConfig(**VISION)
        config = t.Qwen3_5MoeConfig(text_config=text.to_dict(), vision_config=vision)
        return t.Qwen3_5MoeForConditionalGeneration(config)
    text = t.Qwen3_5TextConfig(intermediate_size=256, **COMMON)
    vision = t.Qwen3_5VisionConfig(**VISION)
    config = t.Qwen3_5Config(text_config=text.to_dict(), vision_config=vision)
    return t.Qwen3_5ForConditionalGeneration(config)


def _save_vlm(directory: Path, text_dir: Path, moe: bool = False) -> None:
    """config.json and ``model.visual.*`` of a fresh VLM; text and MTP tensors of ``text_dir``."""
    torch.manual_seed(1)
    model = _vlm_model(moe)
    randomize(model)
    model.eval().save_pretrained(directory)
    visual = {k: v for k, v in load_file(directory / "model.safetensors").items() if "visual" in k}
    tensors = {
        k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
        for k, v in load_file(text_dir / "model.safetensors").items()
    }
    save_file({**tensors, **visual}, directory / "model.safetensors", metadata={"format": "pt"})
    for name in TEXT_FILES:
        shutil.copy(text_dir / name, directory / name)


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory, tiny_dense):
    directory = tmp_path_factory.mktemp("tiny_vlm")
    _save_vlm(directory, tiny_dense)
    (directory / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    return directory


@pytest.fixture(scope="module")
def converted(tmp_path_factory, tiny_vlm, tiny_dense):
    """recipe -> (VLM artifact, text-only artifact), both converted once per module."""
    out = tmp_path_factory.mktemp("vision_artifacts")
    result = {}
    for recipe in RECIPES:
        vlm, text = out / f"{recipe}-vlm.ninfer", out / f"{recipe}-text.ninfer"
        convert(recipe, {"base": str(tiny_vlm)}, vlm)
        convert(recipe, {"base": str(tiny_dense)}, text)
        result[recipe] = (vlm, text)
    return result


def expected_vision(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Spec 5.4 names from the HF tensors: qkv split by row thirds, patch conv read flat."""
    tensors = load_file(checkpoint / "model.safetensors")
    prefix = "model.visual."
    sd = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    h = VISION["hidden_size"]
    out = {
        "vision/patch_embedding": sd["patch_embed.proj.weight"].reshape(h, -1),
        "vision/patch_embedding_bias": sd["patch_embed.proj.bias"],
        "vision/position_embedding": sd["pos_embed.weight"],
        "vision/merger/norm_weight": sd["merger.norm.weight"],
        "vision/merger/norm_bias": sd["merger.norm.bias"],
        "vision/merger/fc1": sd["merger.linear_fc1.weight"],
        "vision/merger/fc1_bias": sd["merger.linear_fc1.bias"],
        "vision/merger/fc2": sd["merger.linear_fc2.weight"],
        "vision/merger/fc2_bias": sd["merger.linear_fc2.bias"],
    }
    for i in range(VISION["depth"]):
        v, b = f"vision/layers/{i}/", f"blocks.{i}."
        for n in ("norm1", "norm2"):
            out[f"{v}{n}_weight"] = sd[f"{b}{n}.weight"]
            out[f"{v}{n}_bias"] = sd[f"{b}{n}.bias"]
        weights = sd[b + "attn.qkv.weight"].split(h)
        biases = sd[b + "attn.qkv.bias"].split(h)
        for j, p in enumerate(("query", "key", "value")):
            out[f"{v}attention/{p}"] = weights[j]
            out[f"{v}attention/{p}_bias"] = biases[j]
        out[v + "attention/output"] = sd[b + "attn.proj.weight"]
        out[v + "attention/output_bias"] = sd[b + "attn.proj.bias"]
        for fc in ("fc1", "fc2"):
            out[f"{v}mlp/{fc}"] = sd[f"{b}mlp.linear_{fc}.weight"]
            out[f"{v}mlp/{fc}_bias"] = sd[f"{b}mlp.linear_{fc}.bias"]
    return out


def object_of(art: Artifact, name: str):
    binding = art.bindings[name]
    return art.objects[binding.object if hasattr(binding, "object") else binding.parts[0].object]


def check_clean(path: Path, checkpoint: Path) -> dict:
    with Artifact.open(path) as art:
        report = art.binder_report
        assert report.ok and report.warnings == [], report.errors + report.warnings
        deep = verify(art, strict=True)
        assert deep.ok and deep.warnings == [], deep.errors + deep.warnings
    result = verify_against_source(path, {"base": str(checkpoint)})
    assert result["errors"] == []
    return result


@pytest.mark.parametrize("recipe", RECIPES)
def test_vision_component_record(converted, tiny_vlm, recipe):
    path, _ = converted[recipe]
    result = check_clean(path, tiny_vlm)
    with Artifact.open(path) as art:
        assert set(art.components) == {"text", "mtp", "vision"}
        vision = art.components["vision"]
        assert vision.target == "text"
        assert vision.config["model_type"] == "qwen3_5_vision"
        members = {k: vision.config[k] for k in VISION if k != "out_hidden_size"}
        assert members == {k: v for k, v in VISION.items() if k != "out_hidden_size"}
        assert vision.resources == {
            "preprocessor_config.json": "resource/vision/preprocessor_config.json"
        }
        assert json.loads(art.resource("preprocessor_config.json", "vision")) == PROCESSOR
        assert "preprocessor_config.json" not in (art.components["text"].resources or {})
    vision_rows = [r for r in result["parameters"] if r["name"].startswith("vision/")]
    assert len(vision_rows) == len(expected_vision(tiny_vlm))


def test_bf16_vision_is_exact(converted, tiny_vlm):
    path, _ = converted["qwen3_5_bf16"]
    expected = expected_vision(tiny_vlm)
    with Artifact.open(path) as art:
        assert {n for n in art.bindings if n.startswith("vision/")} == set(expected)
        for name, values in expected.items():
            np.testing.assert_array_equal(
                art.parameter(name), values.to(torch.bfloat16).float().numpy(), err_msg=name
            )
        # upstream packing: one parent for query/key/value, one for their biases
        for suffix in ("", "_bias"):
            parents = {
                object_of(art, f"vision/layers/1/attention/{p}{suffix}").id
                for p in ("query", "key", "value")
            }
            assert len(parents) == 1


def test_quantized_recipe_uses_upstream_vision_formats(converted, tiny_vlm):
    path, _ = converted["qwen3_6_27b"]
    expected_formats = {
        "vision/patch_embedding": "q6_g64_fp16",
        "vision/merger/fc1": "q8_g32_fp16",
        "vision/merger/fc2": "q8_g32_fp16",
        "vision/layers/0/attention/query": "q4_g64_fp16",
        "vision/layers/0/attention/value": "q4_g64_fp16",
        "vision/layers/1/mlp/fc1": "q4_g64_fp16",
        "vision/layers/1/attention/output": "q5_g64_fp16",
        "vision/layers/0/mlp/fc2": "q5_g64_fp16",
        "vision/position_embedding": "bf16",
        "vision/layers/0/attention/key_bias": "bf16",
        "vision/merger/norm_weight": "bf16",
    }
    expected = expected_vision(tiny_vlm)
    with Artifact.open(path) as art:
        for name, fmt in expected_formats.items():
            assert object_of(art, name).format == fmt, name
        for name, values in expected.items():  # decoded close to the source (rel. RMS)
            diff = art.parameter(name) - values.float().numpy()
            assert np.sqrt((diff**2).mean() / (values.float().numpy() ** 2).mean()) < 0.2, name


@pytest.mark.parametrize("recipe", RECIPES)
def test_text_parameters_match_the_text_layout(converted, recipe):
    vlm, text = converted[recipe]
    with Artifact.open(vlm) as a, Artifact.open(text) as b:
        names = {n for n in a.bindings if not n.startswith("vision/")}
        assert names == set(b.bindings)
        for name in names:
            np.testing.assert_array_equal(a.parameter(name), b.parameter(name), err_msg=name)
            assert object_of(a, name).format == object_of(b, name).format


def test_moe_text_gets_the_moe_vision_tower(tmp_path, tiny_moe):
    vlm = tmp_path / "moe_vlm"
    vlm.mkdir()
    _save_vlm(vlm, tiny_moe, moe=True)
    out = tmp_path / "moe.ninfer"
    convert("qwen3_6_35b_a3b", {"base": str(vlm)}, out)
    with Artifact.open(out) as art:
        assert art.components["vision"].config["model_type"] == "qwen3_5_moe_vision"
        assert art.components["vision"].resources is None  # no processor file in the source
        assert art.binder_report.ok
        assert art.binder_report.warnings == [
            "vision resource 'preprocessor_config.json' is absent; frontends need it"
        ]
        assert object_of(art, "vision/merger/fc2").format == "q8_g32_fp16"
    assert verify_against_source(out, {"base": str(vlm)})["errors"] == []


def test_vision_with_a_proposal_head(tmp_path, tiny_vlm):
    ranking = tmp_path / "rank.bin"
    np.random.default_rng(0).integers(0, 1000, size=512).astype("<i8").tofile(ranking)
    out = tmp_path / "p.ninfer"
    convert("qwen3_5_bf16", {"base": str(tiny_vlm)}, out, proposal=ProposalRequest(ranking, 256))
    with Artifact.open(out) as art:
        assert {"vision", "mtp"} <= set(art.components)
        assert art.binder_report.parameters["proposal/head"] == (256, COMMON["hidden_size"])
    check_clean(out, tiny_vlm)


def test_components_option_drops_vision(tmp_path, tiny_vlm):
    out = tmp_path / "m.ninfer"
    args = ["--recipe", "qwen3_5_bf16", "--source", str(tiny_vlm), "-o", str(out), "--quiet"]
    result = CliRunner().invoke(convert_cli, [*args, "--components", "text,mtp"])
    assert result.exit_code == 0, result.output
    with Artifact.open(out) as art:
        assert set(art.components) == {"text", "mtp"}
        assert not [n for n in art.bindings if n.startswith("vision/")]
        assert not [o for o in art.objects if o.startswith("resource/vision/")]
    check_clean(out, tiny_vlm)


def test_vision_source_errors(tmp_path, tiny_vlm, tiny_dense):
    out = tmp_path / "x.ninfer"
    with pytest.raises(SourceError, match="asks for vision"):
        convert("qwen3_5_bf16", {"base": str(tiny_dense)}, out, components=("text", "vision"))
    wrong = tmp_path / "wrong"
    shutil.copytree(tiny_vlm, wrong)
    (wrong / "preprocessor_config.json").write_text(json.dumps({**PROCESSOR, "merge_size": 4}))
    with pytest.raises(SourceError, match="merge_size 4 but the vision config"):
        convert("qwen3_5_bf16", {"base": str(wrong)}, out)
    (wrong / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    config = json.loads((wrong / "config.json").read_text())
    config["vision_config"]["depth"] = 1  # block 1 would be silently dropped
    (wrong / "config.json").write_text(json.dumps(config))
    with pytest.raises(SourceError, match=r"leaves model\.visual\.blocks\.1\..* unread"):
        convert("qwen3_5_bf16", {"base": str(wrong)}, out)
    config["vision_config"]["depth"] = 2
    config["vision_config"]["intermediate_size"] = 96
    (wrong / "config.json").write_text(json.dumps(config))
    with pytest.raises(SourceError, match="vision config does not match the weights"):
        convert("qwen3_5_bf16", {"base": str(wrong)}, out)
    assert not out.exists()
