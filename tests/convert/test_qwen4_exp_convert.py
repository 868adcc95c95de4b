"""Qwen4Exp conversion end to end: a tiny transformers checkpoint (``tests.tiny_qwen4_exp``) in
both layouts converts with ``qwen4_exp_bf16`` into an artifact that validates and holds exactly
the checkpoint's tensors (bf16-rounded); ``qwen3_8_flash_next`` imports NVIDIA's NVFP4 experts
word for word; bad checkpoints fail with one line naming the tensor or config member.

The HF -> ninfer mapping is restated here (``logical_values``) from transformers' names, not
taken from the adapter, so a wrong row split or a dropped tensor shows as a mismatch.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ninfer_convert.errors import RecipeError, SourceError
from ninfer_convert.pipeline import convert
from ninfer_convert.verify import verify_against_source
from ninfer_format import Artifact
from ninfer_format.codecs.nvfp4 import nvfp4_absmax, unpack_nvfp4
from ninfer_format.verify import verify
from tests.convert.test_import_encoded import object_rows
from tests.tiny_qwen4_exp import TEXT, VISION, build, state_dict

pytest.importorskip("transformers.models.qwen4_exp")

H, HEADS, HEAD_DIM = TEXT["hidden_size"], TEXT["num_attention_heads"], TEXT["head_dim"]
KEY_WIDTH = TEXT["linear_num_key_heads"] * TEXT["linear_key_head_dim"]
INDEX_QUERY = TEXT["indexer_n_heads"] * TEXT["indexer_head_dim"]
EXPERTS = TEXT["num_experts"]
#: the binder warning every Qwen4Exp artifact with MTP carries
MTP_WARNING = "component 'mtp': not checked by this binder"
SIMPLE = {
    "linear_attn.dt_bias": "gdn/dt_bias",
    "linear_attn.A_log": "gdn/a_log",
    "linear_attn.norm.weight": "gdn/norm",
    "linear_attn.out_proj.weight": "gdn/output",
    "linear_attn.in_proj_z.weight": "gdn/z",
    "linear_attn.in_proj_a.weight": "gdn/a_projection",
    "linear_attn.in_proj_b.weight": "gdn/b_projection",
    "self_attn.k_proj.weight": "attention/key",
    "self_attn.v_proj.weight": "attention/value",
    "self_attn.o_proj.weight": "attention/output",
    "self_attn.q_norm.weight": "attention/query_norm",
    "self_attn.k_norm.weight": "attention/key_norm",
    "self_attn.indexer.q_layernorm.weight": "indexer/query_norm",
    "self_attn.indexer.k_layernorm.weight": "indexer/key_norm",
    "mlp.gate.weight": "moe/router",
    "mlp.shared_expert_gate.weight": "moe/shared_score",
    "mlp.shared_expert.gate_proj.weight": "moe/shared/gate",
    "mlp.shared_expert.up_proj.weight": "moe/shared/up",
    "mlp.shared_expert.down_proj.weight": "moe/shared/down",
    "ple.key_proj.weight": "ple/key",
    "ple.value_proj.weight": "ple/value",
    "ple.norm_key.weight": "ple/key_norm",
    "ple.norm_query.weight": "ple/query_norm",
    "ple.norm_conv.weight": "ple/convolution_norm",
}
CONNECTION = {"hc_norm": "norm", "input_mix_weight_down": "down", "input_mix_weight_up": "up"}
CONNECTION["block_inject_weight"] = "inject"
BLOCKS = {"attn_hyper_connection": "mixer_connection", "mlp_hyper_connection": "ffn_connection"}
MTP_STEM = {
    "mtp.fc.weight": "mtp/input_projection",
    "mtp.pre_fc_norm_embedding.weight": "mtp/embedding_norm",
    "mtp.pre_fc_norm_hidden.weight": "mtp/hidden_norm",
}
SHARD = re.compile(r"(.+)\.ple\.ple_embedding\.ngram_embedding\.shard_(\d+)\.weight")
#: the vision tower (Qwen3.5's names, spec 5.4) outside attn.qkv: HF suffix -> ninfer suffix
VISUAL = {
    "patch_embed.proj.bias": "patch_embedding_bias",
    "pos_embed.weight": "position_embedding",
    "attn.proj.weight": "attention/output",
    "attn.proj.bias": "attention/output_bias",
}
for _n in ("norm1", "norm2"):
    VISUAL.update({f"{_n}.weight": f"{_n}_weight", f"{_n}.bias": f"{_n}_bias"})
for _fc in ("fc1", "fc2"):
    VISUAL[f"merger.linear_{_fc}.weight"] = f"merger/{_fc}"
    VISUAL[f"merger.linear_{_fc}.bias"] = f"merger/{_fc}_bias"
    VISUAL[f"mlp.linear_{_fc}.weight"] = f"mlp/{_fc}"
    VISUAL[f"mlp.linear_{_fc}.bias"] = f"mlp/{_fc}_bias"
VISUAL.update({"merger.norm.weight": "merger/norm_weight", "merger.norm.bias": "merger/norm_bias"})
_QKV = ("query", "key", "value")


def _visual(rest: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """One ``model.visual.`` tensor (``rest`` after it) as ninfer parameters."""
    match = re.fullmatch(r"blocks\.(\d+)\.(.+)", rest)
    where, rest = (f"vision/layers/{match[1]}/", match[2]) if match else ("vision/", rest)
    if rest == "patch_embed.proj.weight":  # Conv3d [h, 3, pt, ps, ps] read flat
        return {where + "patch_embedding": t.reshape(t.shape[0], -1)}
    if rest.startswith("attn.qkv."):  # rows [query | key | value], each h wide
        bias = "_bias" if rest.endswith("bias") else ""
        thirds = t.split(VISION["hidden_size"])
        return {f"{where}attention/{p}{bias}": thirds[i] for i, p in enumerate(_QKV)}
    return {where + VISUAL[rest]: t}


def _layer(L: str, rest: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """One decoder-layer tensor (``rest`` after the layer prefix) as ninfer parameters."""
    block, _, part = rest.partition(".")
    if block in BLOCKS:
        return {f"{L}{BLOCKS[block]}/{CONNECTION[part.removesuffix('.weight')]}": t}
    if rest in SIMPLE:
        return {L + SIMPLE[rest]: t}
    if rest == "self_attn.q_proj.weight":  # per head [query_h | gate_h]
        heads = t.reshape(HEADS, 2, HEAD_DIM, H)
        query, gate = (heads[:, i].reshape(HEADS * HEAD_DIM, H) for i in (0, 1))
        return {L + "attention/query": query, L + "attention/gate": gate}
    if rest == "self_attn.indexer.index_qk_proj.weight":
        return {L + "indexer/query": t[:INDEX_QUERY], L + "indexer/key": t[INDEX_QUERY:]}
    if rest == "linear_attn.in_proj_qkv.weight":
        q, k, v = t[:KEY_WIDTH], t[KEY_WIDTH : 2 * KEY_WIDTH], t[2 * KEY_WIDTH :]
        return {L + "gdn/query": q, L + "gdn/key": k, L + "gdn/value": v}
    if rest in ("linear_attn.conv1d.weight", "ple.conv1d.weight"):  # [C, 1, T] -> [T, C]
        return {L + ("gdn" if rest[0] == "l" else "ple") + "/convolution": t[:, 0, :].t()}
    match = re.fullmatch(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", rest)
    assert match, rest
    return {f"{L}moe/experts/{match[1]}/{match[2]}": t}


def logical_values(sd: dict[str, torch.Tensor], text: str) -> dict[str, torch.Tensor]:
    """Every checkpoint tensor under its ninfer name; ``text`` is the language model prefix."""
    out: dict[str, torch.Tensor] = {}
    shards: dict[str, dict[int, torch.Tensor]] = {}
    for name, t in sd.items():
        if name.startswith("model.visual."):
            out.update(_visual(name.removeprefix("model.visual."), t))
            continue
        if match := SHARD.fullmatch(name):
            shards.setdefault(match[1], {})[int(match[2])] = t
            continue
        if name == "lm_head.weight":
            out["text/output_head"] = t
        elif name == text + "embed_tokens.weight":
            out["text/token_embedding"] = t
        elif name in MTP_STEM:
            out[MTP_STEM[name]] = t
        elif name.startswith((text + "hyper_connection_mixer.", "mtp.hyper_connection_mixer.")):
            where = "text" if name.startswith(text) else "mtp"
            part = name.split(".")[-2]
            out[f"{where}/final_connection/{CONNECTION[part]}"] = t
        elif match := re.fullmatch(r"mtp\.layers\.(\d+)\.(.+)", name):
            out.update(_layer(f"mtp/layers/{match[1]}/", match[2], t))
        else:
            match = re.fullmatch(re.escape(text) + r"layers\.(\d+)\.(.+)", name)
            assert match, name
            out.update(_layer(f"text/layers/{match[1]}/", match[2], t))
    for prefix, parts in shards.items():
        layer = prefix.rsplit(".", 1)[1]
        table = torch.cat([parts[j] for j in sorted(parts)])
        assert sorted(parts) == list(range(len(parts))), prefix
        out[f"text/layers/{layer}/ple/ngram_table"] = table
    return out


def _stored(name: str, t: torch.Tensor) -> np.ndarray:
    """What a lossless artifact holds: fp32 for the GDN decay parameters, bf16 otherwise."""
    if name.endswith(("gdn/a_log", "gdn/dt_bias")):
        return t.float().numpy()
    return t.to(torch.bfloat16).float().numpy()


def binder_warnings(art: Artifact) -> list[str]:
    """The binder's warnings, less the one every MTP artifact carries."""
    return [w for w in art.binder_report.warnings if not w.startswith(MTP_WARNING)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("qwen4_exp") / "text")


@pytest.fixture(scope="module")
def tiny_multimodal(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("qwen4_exp") / "multimodal", multimodal=True, seed=1)


@pytest.mark.parametrize("layout", ["text", "multimodal"])
def test_bf16_artifact_is_the_checkpoint(layout, tiny, tiny_multimodal, tmp_path):
    source = tiny if layout == "text" else tiny_multimodal
    out = tmp_path / "m.ninfer"
    convert("qwen4_exp_bf16", {"base": str(source)}, out)
    prefix = "model.language_model." if layout == "multimodal" else "model."
    expected = logical_values(state_dict(source), prefix)
    with Artifact.open(out) as art:
        assert art.binder_report.ok, art.binder_report.errors
        assert binder_warnings(art) == []
        report = verify(art, strict=True)
        assert report.ok and not report.warnings, report.errors + report.warnings
        vision = {"vision"} if layout == "multimodal" else set()
        assert set(art.components) == {"text", "mtp", *vision}
        if vision:
            assert art.components["vision"].config["model_type"] == "qwen4_exp_vision"
        assert set(art.bindings) == set(expected)
        for name, values in expected.items():
            got = art.parameter(name, tuple(values.shape))  # mtp: no contract shape
            np.testing.assert_array_equal(got, _stored(name, values), err_msg=name)
        assert {"text/layers/0/ple/ngram_table", "text/layers/2/ple/ngram_table"} <= set(expected)
        assert "text/layers/1/ple/ngram_table" not in expected
    assert verify_against_source(out, {"base": str(source)})["errors"] == []


# --- qwen3_8_flash_next: experts from NVIDIA's NVFP4 checkpoint ---------------------------------


def _f32(value: np.float32) -> torch.Tensor:
    return torch.tensor(float(value), dtype=torch.float32)


def modelopt_experts(base: Path, out_dir: Path) -> dict[str, tuple]:
    """A ModelOpt NVFP4 checkpoint of ``base``: every routed expert matrix encoded with its own
    divisor (U8 codes, E4M3 ``weight_scale``, ``weight_scale_2`` = 1/d, ``input_scale``), the
    rest as in the base. Returns weight name -> (packed codes, scale bytes, divisor bytes)."""
    sd = load_file(base / "model.safetensors")
    out, words = dict(sd), {}
    for i, name in enumerate(n for n in sd if re.search(r"^model\.layers\..*experts\.\d+\.", n)):
        codes, scales, divisors = nvfp4_absmax(sd[name].float().numpy())
        packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
        out[name] = torch.from_numpy(packed)
        out[name + "_scale"] = torch.from_numpy(scales).view(torch.float8_e4m3fn)
        out[name + "_scale_2"] = _f32(np.float32(1) / divisors[0])
        out[name.removesuffix("weight") + "input_scale"] = _f32(np.float32(1) / (50 + i))
        divisor = np.float32(1) / np.float32(out[name + "_scale_2"].item())
        words[name] = (packed, scales, divisor.tobytes())
    out_dir.mkdir()
    save_file({k: v.contiguous() for k, v in out.items()}, out_dir / "model.safetensors")
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt"}
    (out_dir / "config.json").write_text(json.dumps(config))
    return words


@pytest.fixture(scope="module")
def nvidia(tiny, tmp_path_factory) -> tuple[Path, dict[str, tuple]]:
    out = tmp_path_factory.mktemp("nvidia") / "nvfp4"
    return out, modelopt_experts(tiny, out)


def _format(art: Artifact, name: str) -> str:
    return art.objects[object_rows(art, name)[0]].format


def test_flash_next_imports_nvidia_experts(tiny, nvidia, tmp_path):
    source, words = nvidia
    specs = {"base": str(tiny), "nvidia": str(source)}
    out = tmp_path / "flash.ninfer"
    convert("qwen3_8_flash_next", specs, out)
    with Artifact.open(out) as art:
        assert art.binder_report.ok, art.binder_report.errors
        assert binder_warnings(art) == []
        assert verify(art, strict=True).ok
        imported = 0
        for name in art.bindings:
            match = re.fullmatch(r"text/layers/(\d+)/moe/experts/(\d+)/(\w+)", name)
            if not match:
                continue
            oid, a, b = object_rows(art, name)
            obj = art.objects[oid]
            assert obj.format == "nvfp4", name
            codes, scales, divisors = unpack_nvfp4(art.raw(oid), tuple(obj.shape), obj.divisors)
            packed, src_scales, divisor = words[
                f"model.layers.{match[1]}.mlp.experts.{match[2]}.{match[3]}_proj.weight"
            ]
            nibbles = np.stack([packed & 0xF, packed >> 4], -1).reshape(packed.shape[0], -1)
            np.testing.assert_array_equal(codes[a:b], nibbles, err_msg=name)
            np.testing.assert_array_equal(scales[a:b], src_scales, err_msg=name)
            assert divisors[a // (b - a)].tobytes() == divisor, name
            imported += 1
        assert imported == len(TEXT["layer_types"]) * EXPERTS * 3
        formats = {
            "text/layers/1/attention/query": "q8_g32_fp16",
            "text/layers/0/gdn/value": "q8_g32_fp16",
            "text/layers/0/gdn/a_projection": "bf16",
            "text/layers/0/moe/shared/down": "q8_g32_fp16",
            "text/layers/0/moe/router": "bf16",
            "text/layers/0/ple/ngram_table": "nf4_g64_fp16",
            "text/layers/0/ple/key": "bf16",
            "text/layers/1/indexer/query": "bf16",
            "text/layers/1/mixer_connection/down": "bf16",
            "text/token_embedding": "q8_g32_fp16",
            "text/output_head": "q6_g64_fp16",
            "mtp/layers/0/attention/query": "q8_g32_fp16",
            "mtp/layers/0/moe/experts/3/down": "fp8_e4m3fn_row_bf16",
            "proposal/head": "q4_g64_fp16",
        }
        assert {n: _format(art, n) for n in formats} == formats
        assert list(art.objects[object_rows(art, "proposal/head")[0]].shape) == [512, H]
        np.testing.assert_array_equal(art.parameter("proposal/token_ids"), np.arange(512))
        proposal = art.components["text"].proposal
        assert proposal is not None and (proposal.domain, proposal.rows) == ("indexed", 512)
        policies = {(u.parameter, u.activation_policy) for u in art.uses}
        assert ("mtp/layers/0/moe/experts/0/gate", "AllowA8") in policies
        assert ("text/layers/3/moe/experts/2/up", "AllowA4") in policies
        assert ("proposal/head", "A16Only") in policies
    assert verify_against_source(out, specs)["errors"] == []


# --- bad input: one line naming the tensor or member --------------------------------------------


def _variant(source: Path, tmp_path: Path, edit) -> Path:
    """A copy of ``source`` whose tensors (and config) ``edit`` changes in place."""
    target = tmp_path / "variant"
    shutil.copytree(source, target)
    tensors = load_file(target / "model.safetensors")
    config = json.loads((target / "config.json").read_text())
    edit(tensors, config)
    save_file(tensors, target / "model.safetensors")
    (target / "config.json").write_text(json.dumps(config))
    return target


def _one_line(caught: pytest.ExceptionInfo) -> str:
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def test_ple_on_an_attention_layer_is_named(tiny, tmp_path):
    variant = _variant(tiny, tmp_path, lambda t, c: c.update(ple_layer_ids=[1, 2]))
    with pytest.raises(SourceError) as caught:
        convert("qwen4_exp_bf16", {"base": str(variant)}, tmp_path / "x.ninfer")
    message = _one_line(caught)
    assert "'ple_layer_ids' names non-linear_attention layers [2]" in message
    assert not list(tmp_path.glob("x.ninfer*"))


def test_a_missing_ngram_shard_is_named(tiny, tmp_path):
    shard = "model.layers.2.ple.ple_embedding.ngram_embedding.shard_1.weight"
    variant = _variant(tiny, tmp_path, lambda t, c: t.pop(shard))
    with pytest.raises(SourceError) as caught:
        convert("qwen4_exp_bf16", {"base": str(variant)}, tmp_path / "x.ninfer")
    message = _one_line(caught)
    assert f"tensor {shard!r} (for text/layers/2/ple/ngram_table) is missing" in message
    assert not list(tmp_path.glob("x.ninfer*"))


def test_nvfp4_scales_of_the_wrong_shape_are_named(tiny, nvidia, tmp_path):
    name = "model.layers.1.mlp.experts.2.down_proj.weight_scale"

    def narrow(tensors, config):
        tensors[name] = tensors[name][:, :-1].contiguous()

    variant = _variant(nvidia[0], tmp_path, narrow)
    specs = {"base": str(tiny), "nvidia": str(variant)}
    with pytest.raises(RecipeError) as caught:
        convert("qwen3_8_flash_next", specs, tmp_path / "x.ninfer")
    message = _one_line(caught)
    assert name in message and "do not hold NVFP4 rows of 128 values" in message
    assert not list(tmp_path.glob("x.ninfer*"))


def test_an_mtp_tensor_outside_the_layout_is_named(tiny, tmp_path):
    extra = "mtp.layers.0.self_attn.sinks"

    def add(tensors, config):
        tensors[extra] = torch.zeros(HEADS)

    variant = _variant(tiny, tmp_path, add)
    with pytest.raises(RecipeError) as caught:
        convert("qwen4_exp_bf16", {"base": str(variant)}, tmp_path / "x.ninfer")
    assert _one_line(caught).startswith(f"{extra}: not part of the Qwen4Exp MTP layout")


def test_an_mtp_layer_without_an_indexer_converts(tiny, tmp_path):
    def drop_indexer(tensors, config):
        for name in [n for n in tensors if n.startswith("mtp.layers.0.self_attn.indexer.")]:
            del tensors[name]

    variant = _variant(tiny, tmp_path, drop_indexer)
    out = tmp_path / "m.ninfer"
    convert("qwen4_exp_bf16", {"base": str(variant)}, out)
    with Artifact.open(out) as art:
        assert art.binder_report.ok, art.binder_report.errors
        assert "mtp/layers/0/attention/query" in art.bindings
        assert not [n for n in art.bindings if n.startswith("mtp/layers/0/indexer/")]
        assert "text/layers/1/indexer/query" in art.bindings
