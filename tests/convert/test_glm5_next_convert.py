"""GLM5Next conversion: the tiny transformers checkpoint (``tests/tiny_glm5_next.py``) converts
with ``glm5_next_bf16`` to an artifact whose every parameter is the bf16-rounded (fp32 where the
binder says so) transformers state dict, read through a mapping written out here independently
of the adapter; ``glm5next`` imports NVIDIA-style NVFP4 words byte-identical; bad checkpoints
and configs fail before anything is written, in one line naming what is wrong."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ninfer_convert.adapters.glm5_next import has_mtp
from ninfer_convert.block_fp8 import decode_block_fp8
from ninfer_convert.errors import RecipeError, SourceError
from ninfer_convert.pipeline import convert
from ninfer_convert.recipe import Recipe
from ninfer_format import Artifact
from ninfer_format.binders.glm5_next import expected_parameters
from ninfer_format.binders.qwen3_5 import Role
from ninfer_format.codecs.nvfp4 import unpack_nvfp4
from ninfer_format.numeric import E4M3FN_VALUES, f32_to_e4m3fn
from ninfer_format.verify import verify
from tests.convert.test_import_encoded import Quantizer, object_rows, write_checkpoint
from tests.format.test_glm5_next_geometry import SIMPLE
from tests.tiny_glm5_next import TEXT, TEXT_PREFIX, build_model, build_tiny_glm5_next

pytest.importorskip("transformers.models.glm5_next")

MTP_LAYER = TEXT["num_hidden_layers"]
#: released spellings of what transformers renames on load -> transformers' names
RELEASED = {
    "hc_attn_fn": "attn_hc.fn",
    "hc_attn_base": "attn_hc.base",
    "hc_attn_scale": "attn_hc.scale",
    "hc_ffn_fn": "ffn_hc.fn",
    "hc_ffn_base": "ffn_hc.base",
    "hc_ffn_scale": "ffn_hc.scale",
}
MTP_STEM = {
    "eh_proj": "mtp/input_projection",
    "enorm": "mtp/embedding_norm",
    "hnorm": "mtp/hidden_norm",
    "shared_head.norm": "mtp/final_norm",
}


def logical_values(name: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
    """The ninfer parameters one HF tensor holds, values split as the binder's docstring
    says (transformers' names, or the released ones for per-expert MoE and hyper-connections;
    layer ``MTP_LAYER`` is the MTP block)."""
    if name == "lm_head.weight":
        return {"text/output_head": value}
    key = re.sub(r"\.weight$", "", name.removeprefix(TEXT_PREFIX))
    globals_ = {"embed_tokens": "text/token_embedding", "norm": "text/final_norm"}
    if key in globals_:
        return {globals_[key]: value}
    match = re.fullmatch(r"layers\.(\d+)\.(.+)", key)
    assert match, name
    layer, rest = int(match[1]), RELEASED.get(match[2], match[2])
    mtp = layer == MTP_LAYER
    L = "mtp/layers/0/" if mtp else f"text/layers/{layer}/"
    if mtp and rest in MTP_STEM:
        return {MTP_STEM[rest]: value}
    if rest == "self_attn.o_proj":
        linear = not mtp and TEXT["layer_types"][layer] == "linear_attention"
        return {L + ("kda/output" if linear else "mla/output"): value}
    if rest in SIMPLE:
        return {L + SIMPLE[rest]: value}
    if rest == "self_attn.conv1d":  # [3W, 1, T] -> [T, 3W]
        return {L + "kda/convolution": value[:, 0, :].t()}
    if rest == "self_attn.kv_b_proj":
        heads, nope = TEXT["num_attention_heads"], TEXT["qk_nope_head_dim"]
        per_head = value.reshape(heads, -1, value.shape[-1])
        return {
            L + "mla/key_up": per_head[:, :nope].reshape(-1, value.shape[-1]),
            L + "mla/value_up": per_head[:, nope:].reshape(-1, value.shape[-1]),
        }
    expert = re.fullmatch(r"mlp\.experts\.(\d+)\.(\w+)_proj", rest)
    if expert:
        return {f"{L}moe/experts/{expert[1]}/{expert[2]}": value}
    width = TEXT["moe_intermediate_size"]
    if rest == "mlp.experts.gate_up_proj":  # [E, 2I, H]
        return {
            f"{L}moe/experts/{e}/{which}": value[e, i * width : (i + 1) * width]
            for e in range(value.shape[0])
            for i, which in enumerate(("gate", "up"))
        }
    assert rest == "mlp.experts.down_proj", name  # [E, H, I]
    return {f"{L}moe/experts/{e}/down": value[e] for e in range(value.shape[0])}


#: the vision tower's HF names (after ``model.visual.``) -> logical names, read flat
VISION_NAMES = {
    "patch_embed.proj.weight": "patch_embedding",
    "patch_embed.proj.bias": "patch_embedding_bias",
    "post_layernorm.weight": "post_norm",
    "downsample.weight": "downsample",
    "downsample.bias": "downsample_bias",
    "merger.proj.weight": "merger/projection",
    "merger.post_projection_norm.weight": "merger/norm_weight",
    "merger.post_projection_norm.bias": "merger/norm_bias",
    **{f"merger.{p}_proj.weight": f"merger/{p}" for p in ("gate", "up", "down")},
    "norm1.weight": "norm1_weight",
    "norm2.weight": "norm2_weight",
    "attn.q_norm.weight": "attention/query_norm",
    "attn.k_norm.weight": "attention/key_norm",
    "attn.proj.weight": "attention/output",
    "attn.proj.bias": "attention/output_bias",
    **{f"mlp.{p}_proj.weight": f"mlp/{p}" for p in ("gate", "up", "down")},
    **{f"mlp.{p}_proj.bias": f"mlp/{p}_bias" for p in ("gate", "up", "down")},
}


def vision_values(name: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
    """The vision parameters one ``model.visual.*`` tensor holds: convolutions flat, the fused
    ``attn.qkv`` split into query, key and value thirds."""
    block = re.fullmatch(r"blocks\.(\d+)\.(.+)", name.removeprefix("model.visual."))
    prefix, rest = ("vision/", name.removeprefix("model.visual."))
    if block:
        prefix, rest = f"vision/layers/{block[1]}/", block[2]
    if rest.startswith("attn.qkv."):
        suffix = "_bias" if rest.endswith("bias") else ""
        thirds = value.reshape(3, -1, *value.shape[1:])
        return {
            f"{prefix}attention/{which}{suffix}": thirds[i]
            for i, which in enumerate(("query", "key", "value"))
        }
    flat = value.reshape(value.shape[0], -1) if value.dim() > 2 else value
    return {prefix + VISION_NAMES[rest]: flat}


def expected_values(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        split = vision_values if name.startswith("model.visual.") else logical_values
        for logical, v in split(name, value).items():
            assert logical not in out, logical
            out[logical] = v
    return out


def assert_parameters_equal(art: Artifact, expected: dict[str, torch.Tensor]) -> None:
    specs = expected_parameters(TEXT, components=("text", "mtp"))
    fp32 = {s.name for s in specs if s.role is Role.FP32_VECTOR}
    for name, value in expected.items():
        rounded = value if name in fp32 else value.to(torch.bfloat16)
        got = art.parameter(name)
        np.testing.assert_array_equal(got, rounded.float().numpy(), err_msg=name)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_glm5_next(tmp_path_factory.mktemp("glm5_next") / "ckpt")


@pytest.fixture(scope="module")
def bf16(tiny: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("glm5_next_bf16") / "m.ninfer"
    convert("glm5_next_bf16", {"base": str(tiny)}, out)
    return out


def test_bf16_artifact_is_the_transformers_state_dict(tiny: Path, bf16: Path) -> None:
    state = build_model().state_dict()  # the same seed and draws as the checkpoint
    mtp = {
        k: v
        for k, v in load_file(tiny / "model.safetensors").items()
        if k.startswith(f"{TEXT_PREFIX}layers.{MTP_LAYER}.")
    }
    expected = expected_values({**state, **mtp})
    with Artifact.open(bf16) as art:
        assert art.binder_report.ok, art.binder_report.errors
        assert not art.binder_report.warnings, art.binder_report.warnings  # mtp checked too
        assert art.binder_report.parameters["mtp/layers/0/mla/key_up"] == (64, 64)
        assert set(art.components) == {"text", "mtp", "vision"}
        assert art.components["vision"].config["model_type"] == "glm5_next_vision"
        report = verify(art, strict=True)
        assert report.ok, report.errors
        assert set(art.bindings) == set(expected)
        assert_parameters_equal(art, expected)
        arch = art.components["text"].config["architectures"]
        assert arch == ["Glm5NextForConditionalGeneration"]


def test_the_state_dict_layout_converts_the_same(tiny: Path, bf16: Path, tmp_path: Path) -> None:
    """Fused experts and convolution, ``forget_gate.*`` and ``attn_hc.*`` as transformers
    holds them map to the same parameters as the released names."""
    raw = tmp_path / "raw"
    raw.mkdir()
    state = build_model().state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, raw / "model.safetensors")
    for f in tiny.iterdir():
        if f.suffix in (".json", ".jinja") and f.name != "model.safetensors.index.json":
            shutil.copy(f, raw / f.name)
    assert f"{TEXT_PREFIX}layers.0.attn_hc.fn" in state  # the other spelling indeed
    out = tmp_path / "raw.ninfer"
    convert("glm5_next_bf16", {"base": str(raw)}, out)
    with Artifact.open(out) as a, Artifact.open(bf16) as b:
        assert set(a.bindings) == {n for n in b.bindings if not n.startswith("mtp/")}
        for name in a.bindings:
            np.testing.assert_array_equal(a.parameter(name), b.parameter(name), err_msg=name)


# --- glm5next: NVIDIA's NVFP4 checkpoint as the source ------------------------------------------


def _layer(i: int) -> str:
    return f"{TEXT_PREFIX}layers.{i}."


def _block_fp8(out: dict, name: str) -> torch.Tensor:
    """``name`` as block-FP8 (128 x 128 tiles): codes and ``weight_scale_inv``; returns the
    values the pair decodes to."""
    w = out[name].float()
    rows, cols = w.shape
    tiles = w.reshape((rows + 127) // 128, min(rows, 128), (cols + 127) // 128, min(cols, 128))
    multipliers = tiles.abs().amax(dim=(1, 3)) / 448
    scale = multipliers.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    codes = f32_to_e4m3fn((w / scale).numpy())
    out[name] = torch.from_numpy(codes).view(torch.float8_e4m3fn)
    out[name + "_scale_inv"] = multipliers.contiguous()
    return torch.from_numpy(E4M3FN_VALUES[codes]) * scale


@pytest.fixture(scope="module")
def nvidia(tiny: Path, tmp_path_factory) -> tuple[Path, Quantizer, dict[str, torch.Tensor]]:
    """ModelOpt NVFP4 routed and shared experts (each matrix its own divisor) and dense MLPs
    (gate/up sharing one, as vLLM fuses them); the MTP stem and experts block-FP8."""
    sd = load_file(tiny / "model.safetensors")
    out, q = dict(sd), Quantizer("modelopt")
    for i, kind in enumerate(TEXT["mlp_layer_types"]):
        p = _layer(i) + "mlp."
        if kind == "dense":
            q.nvfp4_group(out, sd, [p + "gate_proj.weight", p + "up_proj.weight"])
            q.nvfp4_group(out, sd, [p + "down_proj.weight"])
            continue
        for e in range(TEXT["n_routed_experts"]):
            for which in ("gate", "up", "down"):
                q.nvfp4_group(out, sd, [p + f"experts.{e}.{which}_proj.weight"])
        for which in ("gate", "up", "down"):
            q.nvfp4_group(out, sd, [p + f"shared_experts.{which}_proj.weight"])
    mtp = _layer(MTP_LAYER)
    decoded = {
        name: _block_fp8(out, name)
        for name in (mtp + "eh_proj.weight", mtp + "mlp.experts.0.gate_proj.weight")
    }
    path = write_checkpoint(tiny, tmp_path_factory.mktemp("nvidia") / "nv", out, "modelopt")
    return path, q, decoded


def test_glm5next_imports_nvidia_words(tiny: Path, nvidia: tuple, tmp_path: Path) -> None:
    source, q, block_decoded = nvidia
    out = tmp_path / "nv.ninfer"
    report = convert("glm5next", {"base": str(tiny), "nvidia": str(source)}, out)
    imported = [p for p in report.parameters if p.method == "import_encoded"]
    experts = TEXT["n_routed_experts"] * 3 * TEXT["mlp_layer_types"].count("sparse")
    assert len(imported) == experts + 3 * TEXT["mlp_layer_types"].count("dense")
    assert all(p.rmse == 0 for p in imported)
    with Artifact.open(out) as art:
        assert art.binder_report.ok, art.binder_report.errors
        assert verify(art).ok
        for name in (p.name for p in imported):
            oid, a, b = object_rows(art, name)
            obj = art.objects[oid]
            codes, scales, divisors = unpack_nvfp4(
                art.raw(oid), tuple(obj.shape), obj.divisors or 1
            )
            layer, rest = name.split("/", 3)[2:]
            weight = _layer(int(layer)) + re.sub(
                r"^(?:moe/|mlp/)(experts/(\d+)/)?(\w+)$",
                lambda m: f"mlp.{'experts.' + m[2] + '.' if m[2] else ''}{m[3]}_proj.weight",
                rest,
            )
            packed, src_scales, divisor, _ = q.nvfp4[weight]
            nibbles = np.stack([packed & 0xF, packed >> 4], -1).reshape(packed.shape[0], -1)
            np.testing.assert_array_equal(codes[a:b], nibbles, err_msg=name)
            np.testing.assert_array_equal(scales[a:b], src_scales, err_msg=name)
            per = obj.shape[0] // len(divisors)
            assert divisors[a // per].tobytes() == divisor.tobytes(), name
        text = [n for n in art.bindings if not n.startswith("vision/")]  # read from base, bf16
        formats = {n: art.objects[object_rows(art, n)[0]].format for n in text}
        assert formats["text/layers/0/kda/output"] == formats["text/layers/1/mla/output"]
        assert formats["text/layers/1/mla/output"] == "q8_g32_fp16"
        assert formats["mtp/input_projection"] == "fp8_e4m3fn_row_bf16"
        assert formats["mtp/layers/0/moe/experts/3/down"] == "fp8_e4m3fn_row_bf16"
        assert formats["mtp/layers/0/moe/router"] == formats["text/layers/0/kda/query"] == "bf16"
        uses = [u for u in art.uses if u.activation_policy == "AllowA4"]
        assert {u.parameter for u in uses} == {p.name for p in imported}
        # the shared experts NVIDIA quantized are cast from their decoded values
        shared = "text/layers/2/moe/shared/up"
        oid, a, b = object_rows(art, shared)
        assert art.objects[oid].format == "bf16"
        # a block-FP8 MTP matrix is decoded, then re-quantized row by row
        for name, values in block_decoded.items():
            logical = next(iter(logical_values(name, values)))
            got = art.parameter(logical).reshape(values.shape)
            error = np.abs(got - values.numpy()).max() / np.abs(values.numpy()).max()
            assert error < 0.07, (logical, error)  # half an E4M3 step of the row's max


# --- bad input --------------------------------------------------------------------------------


def _variant(tiny: Path, tmp_path: Path, tensors=None, config=None, document=None) -> Path:
    """A copy of the checkpoint with ``tensors(dict)`` / ``config(text config dict)`` /
    ``document(config.json dict)`` applied."""
    out = tmp_path / "variant"
    shutil.copytree(tiny, out)
    if tensors is not None:
        sd = load_file(out / "model.safetensors")
        tensors(sd)
        save_file(sd, out / "model.safetensors")
    if config is not None or document is not None:
        whole = json.loads((out / "config.json").read_text())
        if config is not None:
            config(whole["text_config"])
        if document is not None:
            document(whole)
        (out / "config.json").write_text(json.dumps(whole))
    return out


def _one_line_error(source: Path, tmp_path: Path, error: type, **kwargs: Any) -> str:
    out = tmp_path / "bad.ninfer"
    with pytest.raises(error) as caught:
        convert("glm5_next_bf16", {"base": str(source)}, out, **kwargs)
    assert not out.exists()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_latent_projection_of_the_wrong_rank_is_named(tiny: Path, tmp_path: Path) -> None:
    name = _layer(1) + "self_attn.kv_a_proj_with_mqa.weight"

    def widen(sd: dict) -> None:  # kv_lora_rank + 8 rows, as if a rope part were there
        sd[name] = torch.cat([sd[name], sd[name][:8]])

    message = _one_line_error(_variant(tiny, tmp_path, tensors=widen), tmp_path, SourceError)
    assert f"{name} [72, 128]" in message
    assert "text/layers/1/mla/kv_down [64, 128]" in message


def test_a_zero_sinkhorn_iteration_count_is_refused(tiny: Path, tmp_path: Path) -> None:
    def zero(text: dict) -> None:
        text["hc_sinkhorn_iters"] = 0

    message = _one_line_error(_variant(tiny, tmp_path, config=zero), tmp_path, SourceError)
    assert "config.json" in message
    assert "'hc_sinkhorn_iters' must be a positive integer" in message


def test_an_unknown_mtp_tensor_is_named(tiny: Path, tmp_path: Path) -> None:
    extra = _layer(MTP_LAYER) + "hc_head_fn"

    def add(sd: dict) -> None:
        sd[extra] = torch.zeros(2, 2)

    message = _one_line_error(_variant(tiny, tmp_path, tensors=add), tmp_path, RecipeError)
    assert message.startswith(extra) and "MTP layout" in message


def test_a_vision_config_that_misdescribes_the_tower_is_named(tiny: Path, tmp_path: Path) -> None:
    def deeper(document: dict) -> None:
        document["vision_config"]["depth"] = 2

    message = _one_line_error(_variant(tiny, tmp_path, document=deeper), tmp_path, SourceError)
    assert "model.visual.blocks.1." in message and "is missing" in message

    def narrower(document: dict) -> None:
        document["vision_config"]["out_hidden_size"] = 64

    other = tmp_path / "narrower"
    other.mkdir()
    message = _one_line_error(_variant(tiny, other, document=narrower), other, Exception)
    assert "'out_hidden_size' must be the text hidden size 128, got 64" in message


def test_the_mtp_block_is_found_under_either_prefix_plain_or_quantized() -> None:
    config = {"num_hidden_layers": 3}
    assert has_mtp(
        {"model.layers.0.input_layernorm.weight", "model.layers.3.eh_proj.weight"}, config
    )
    packed = {"model.language_model.layers.3.eh_proj.weight_packed", "lm_head.weight"}
    assert has_mtp(packed, config)
    assert not has_mtp(packed, {"num_hidden_layers": 4})


def test_block_fp8_words_are_decoded_never_imported(tiny: Path, nvidia: tuple, tmp_path) -> None:
    source = nvidia[0]
    recipe = Recipe("mtp_fp8_import", "the block-FP8 stem imported as it is stored")
    recipe.assign("text/*", "mtp/*", source="nvidia")
    recipe.assign("mtp/input_projection", format="fp8_e4m3fn_row_bf16", method="import_encoded")
    specs = {"base": str(tiny), "nvidia": str(source)}
    with pytest.raises(RecipeError, match=r"eh_proj\.weight is block-FP8 .*cannot be imported"):
        convert(recipe, specs, tmp_path / "m.ninfer")
    codes = np.zeros((130, 64), np.uint8)
    with pytest.raises(
        RecipeError, match=r"x_scale_inv has shape \[1, 1\]; \[130, 64\] .* \[2, 1\]"
    ):
        decode_block_fp8(codes, np.ones((1, 1), np.float32), (128, 128), "x_scale_inv")
