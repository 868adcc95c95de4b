"""import_encoded: NVFP4 (ModelOpt, compressed-tensors) and FP8 words imported bit-exact.

The quantized checkpoints are built here from the tiny HF checkpoints: selected projections are
encoded with the reference ``nvfp4_absmax`` / ``fp8_row_maxabs`` and written with each
exporter's field names and dtypes. Projections that vLLM fuses (q/k/v, GDN qkv/z, gate/up)
share one weight divisor, as exporters write them, unless a test wants them to differ.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ninfer_convert.errors import RecipeError, SourceError
from ninfer_convert.pipeline import convert
from ninfer_convert.recipe import Recipe
from ninfer_convert.verify import verify_against_source
from ninfer_format import Artifact
from ninfer_format.codecs.fp8_row import fp8_row_maxabs, unpack_fp8_row
from ninfer_format.codecs.nvfp4 import nvfp4_absmax, unpack_nvfp4
from ninfer_format.numeric import bf16_to_f32, f32_to_bf16
from ninfer_format.verify import verify

HEADS, HEAD_DIM, KEY_WIDTH = 2, 64, 64  # tiny_checkpoints: attention heads, GDN key width
FP8_PROJECTIONS = [
    *(f"self_attn.{x}_proj.weight" for x in "qkvo"),
    *(f"linear_attn.{x}.weight" for x in ("in_proj_qkv", "in_proj_z", "out_proj")),
]


# --- building quantized checkpoints ---------------------------------------------------------


def _f8(words: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(words, dtype=np.uint8)).view(torch.float8_e4m3fn)


def _f32(value: float, shape: tuple[int, ...] = ()) -> torch.Tensor:
    return torch.full(shape, float(np.float32(value)), dtype=torch.float32)


def _module(weight: str) -> str:
    return weight[: -len(".weight")]


class Quantizer:
    """Writes NVFP4 / FP8 fields of chosen weights in one exporter's style."""

    def __init__(self, style: str, activation: bool = True) -> None:
        self.style, self.activation = style, activation
        self.count = 0
        #: weight name -> (packed codes, scale bytes, divisor f32, activation divisor f32)
        self.nvfp4: dict[str, tuple[np.ndarray, np.ndarray, np.float32, np.float32]] = {}
        self.fp8: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def nvfp4_group(self, out: dict, sd: dict, names: list[str]) -> None:
        """One nvfp4_absmax pass over the stacked rows: the members share a divisor."""
        rows = [sd[n].float().numpy() for n in names]
        codes, scales, divisors = nvfp4_absmax(np.concatenate(rows))
        start = 0
        for name, w in zip(names, rows, strict=True):
            block = slice(start, start + w.shape[0])
            start += w.shape[0]
            packed = (codes[block, 0::2] | (codes[block, 1::2] << 4)).astype(np.uint8)
            self.count += 1
            act = np.float32(40 + 3 * self.count)
            self._write(out, name, packed, scales[block], divisors[0], act)

    def _write(self, out, name, packed, scales, divisor, act) -> None:
        del out[name]
        if self.style == "modelopt":  # multipliers: weight_scale_2 = 1/d, input_scale = 1/d_x
            out[name] = torch.from_numpy(packed)
            out[name + "_scale"] = _f8(scales)
            out[name + "_scale_2"] = _f32(np.float32(1) / divisor)
            if self.activation:
                out[_module(name) + ".input_scale"] = _f32(np.float32(1) / act)
            divisor = np.float32(1) / np.float32(out[name + "_scale_2"].item())
            act = np.float32(1) / np.float32(np.float32(1) / act)
        else:  # compressed-tensors: the divisors themselves, shape [1]
            out[name + "_packed"] = torch.from_numpy(packed)
            out[name + "_scale"] = _f8(scales)
            out[name + "_global_scale"] = _f32(divisor, (1,))
            if self.activation:
                out[_module(name) + ".input_global_scale"] = _f32(act, (1,))
        self.nvfp4[name] = (packed, scales, np.float32(divisor), np.float32(act))

    def fp8_row(self, out: dict, sd: dict, name: str, per_tensor: bool = False) -> None:
        w = sd[name].float().numpy()
        codes, words = fp8_row_maxabs(w)
        out[name] = _f8(codes)
        if per_tensor:  # ModelOpt FP8: one F32 scale (lossy once rounded to BF16 rows)
            scale = np.float32(np.abs(w).max() / 448 * 1.001)
            codes = _fp8_codes(w / scale)
            out[name] = _f8(codes)
            out[name + "_scale"] = _f32(scale)
            words = np.full(w.shape[0], f32_to_bf16(np.array([scale]))[0], np.uint16)
        else:
            out[name + "_scale"] = torch.from_numpy(words.view(np.int16)).view(torch.bfloat16)
            out[name + "_scale"] = out[name + "_scale"].reshape(-1, 1)
        self.fp8[name] = (codes, words)


def _fp8_codes(y: np.ndarray) -> np.ndarray:
    from ninfer_format.numeric import f32_to_e4m3fn

    return f32_to_e4m3fn(np.clip(y.astype(np.float32), -448, 448))


def write_checkpoint(base: Path, out_dir: Path, tensors: dict, quant_method: str) -> Path:
    out_dir.mkdir()
    save_file({k: v.contiguous() for k, v in tensors.items()}, out_dir / "model.safetensors")
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = {"quant_method": quant_method}
    (out_dir / "config.json").write_text(json.dumps(config))
    return out_dir


def _layers(sd: dict) -> list[str]:
    return sorted({".".join(k.split(".")[:3]) + "." for k in sd if k.startswith("model.layers.")})


def _dense_quantized(base: Path, out_dir: Path, style: str, *, activation=True) -> Quantizer:
    """Every text projection NVFP4 (fused groups share a divisor); a/b stay float."""
    sd = load_file(base / "model.safetensors")
    out, q = dict(sd), Quantizer(style, activation)
    for p in _layers(sd):
        if p + "self_attn.q_proj.weight" in sd:
            q.nvfp4_group(out, sd, [p + f"self_attn.{x}_proj.weight" for x in "qkv"])
            q.nvfp4_group(out, sd, [p + "self_attn.o_proj.weight"])
        else:
            la = p + "linear_attn."
            q.nvfp4_group(out, sd, [la + "in_proj_qkv.weight", la + "in_proj_z.weight"])
            q.nvfp4_group(out, sd, [la + "out_proj.weight"])
        q.nvfp4_group(out, sd, [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"])
        q.nvfp4_group(out, sd, [p + "mlp.down_proj.weight"])
    write_checkpoint(base, out_dir, out, style)
    return q


# --- reading the artifact ---------------------------------------------------------------------


def object_rows(art: Artifact, name: str) -> tuple[str, int, int]:
    binding = art.bindings[name]
    if hasattr(binding, "object"):
        return binding.object, 0, art.objects[binding.object].shape[0]
    (part,) = binding.parts
    k = art.objects[part.object].shape[1]
    return part.object, part.range[0] // k, part.range[1] // k


def source_rows(name: str, experts_fused: bool = False) -> tuple[str, np.ndarray]:
    """Independent statement of the HF mapping: logical name -> (weight, source rows)."""
    _, _, layer, *rest = name.split("/")
    suffix, p = "/".join(rest), f"model.layers.{layer}."
    if suffix in ("attention/query", "attention/gate"):
        offset = 0 if suffix.endswith("query") else HEAD_DIM
        rows = [h * 2 * HEAD_DIM + offset + np.arange(HEAD_DIM) for h in range(HEADS)]
        return p + "self_attn.q_proj.weight", np.concatenate(rows)
    if suffix in ("gdn/query", "gdn/key", "gdn/value"):
        start = {"gdn/query": 0, "gdn/key": KEY_WIDTH, "gdn/value": 2 * KEY_WIDTH}[suffix]
        stop = start + (KEY_WIDTH if suffix != "gdn/value" else 256)
        return p + "linear_attn.in_proj_qkv.weight", np.arange(start, stop)
    simple = {
        "attention/key": "self_attn.k_proj",
        "attention/value": "self_attn.v_proj",
        "attention/output": "self_attn.o_proj",
        "gdn/z": "linear_attn.in_proj_z",
        "gdn/output": "linear_attn.out_proj",
        "moe/shared/gate": "mlp.shared_expert.gate_proj",
        "moe/shared/up": "mlp.shared_expert.up_proj",
        "moe/shared/down": "mlp.shared_expert.down_proj",
    }
    if suffix in simple:
        return p + simple[suffix] + ".weight", slice(None)  # type: ignore[return-value]
    if suffix.startswith("mlp/"):
        return p + f"mlp.{rest[1]}_proj.weight", slice(None)  # type: ignore[return-value]
    _, _, e, which = suffix.split("/")  # moe/experts/E/which
    return p + f"mlp.experts.{e}.{which}_proj.weight", slice(None)  # type: ignore[return-value]


def check_nvfp4_words(art: Artifact, q: Quantizer) -> set[str]:
    """Every nvfp4 parameter's codes, scales and divisor equal the source words."""
    checked = set()
    for name in art.bindings:
        oid, a, b = object_rows(art, name)
        obj = art.objects[oid]
        if obj.format != "nvfp4" or not name.startswith("text/layers/"):
            continue
        codes, scales, divisors = unpack_nvfp4(art.raw(oid), tuple(obj.shape), obj.divisors or 1)
        weight, rows = source_rows(name)
        packed, src_scales, divisor, _ = q.nvfp4[weight]
        nibbles = np.stack([packed & 0xF, packed >> 4], -1).reshape(packed.shape[0], -1)
        np.testing.assert_array_equal(codes[a:b], nibbles[rows], err_msg=name)
        np.testing.assert_array_equal(scales[a:b], src_scales[rows], err_msg=name)
        per = obj.shape[0] // len(divisors)
        assert divisors[a // per].tobytes() == divisor.tobytes(), name
        checked.add(name)
    return checked


def activation_divisors(art: Artifact) -> dict[tuple[str, str], float]:
    out = {}
    for use in art.uses:
        aux = (use.auxiliaries or {}).get("activation_input_divisor")
        if aux is not None:
            obj = art.objects[aux.object]
            assert (
                obj.format == "fp32" and list(obj.shape) == [] and obj.id.startswith("auxiliary/")
            )
            out[(use.parameter, use.input)] = art.tensor(aux.object).item()
    return out


def expected_activation(art: Artifact, q: Quantizer, name: str) -> np.float32:
    """The smallest activation divisor over the sources of ``name``'s parent object."""
    oid = object_rows(art, name)[0]
    sharing = [n for n in art.bindings if object_rows(art, n)[0] == oid]
    return min(q.nvfp4[source_rows(n)[0]][3] for n in sharing)


def check_artifact(path: Path, specs: dict[str, str], *, ext_all: bool = False) -> dict:
    with Artifact.open(path) as art:
        assert art.binder_report.ok, art.binder_report.errors
        assert not art.binder_report.warnings, art.binder_report.warnings
        report = verify(art, strict=True)
        assert report.ok, report.errors
        assert not report.warnings or ext_all, report.warnings
        if not ext_all:
            assert all(o.divisors is None for o in art.objects.values() if hasattr(o, "divisors"))
    result = verify_against_source(path, specs)
    assert result["errors"] == []
    return result


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def modelopt_dense(tiny_dense, tmp_path_factory):
    out = tmp_path_factory.mktemp("modelopt") / "q"
    return out, _dense_quantized(tiny_dense, out, "modelopt")


# --- the recipes ------------------------------------------------------------------------------


def test_qwen3_6_27b_nvfp4_imports_modelopt_words(tmp_path, tiny_dense, modelopt_dense):
    quantized, q = modelopt_dense
    out = tmp_path / "m.ninfer"
    specs = {"base": str(tiny_dense), "quantized": str(quantized)}
    report = convert("qwen3_6_27b_nvfp4", specs, out)
    check_artifact(out, specs)
    with Artifact.open(out) as art:
        checked = check_nvfp4_words(art, q)
        # attention on layers < 24 and gdn/output... stay bf16; GDN, MLP and layer 1's
        # attention/output are imported
        assert "text/layers/1/attention/output" in checked
        assert "text/layers/3/attention/output" not in checked
        assert {"text/layers/0/gdn/value", "text/layers/2/mlp/down"} <= checked
        assert art.objects[object_rows(art, "text/layers/1/attention/query")[0]].format == "bf16"
        # fused sources share a divisor: one parent each for GDN q|k|v|z and MLP gate|up
        qkvz = {object_rows(art, f"text/layers/0/gdn/{s}")[0] for s in ("query", "value", "z")}
        assert len(qkvz) == 1
        divisors = activation_divisors(art)
        a4 = [u for u in art.uses if u.activation_policy == "AllowA4"]
        assert a4 and len(divisors) == len(a4)
        for use in a4:
            expected = expected_activation(art, q, use.parameter)
            assert np.float32(divisors[(use.parameter, use.input)]) == expected
        ids = [o.id for o in art.directory.objects]
        assert ids.index("auxiliary/000000") > max(i for i, x in enumerate(ids) if "weight/" in x)
    imported = [p for p in report.parameters if p.method == "import_encoded"]
    assert imported and all(p.rmse == 0 for p in imported)


def test_query_gate_split_moves_code_and_scale_rows_together(tmp_path, tiny_dense, modelopt_dense):
    quantized, q = modelopt_dense
    recipe = Recipe("attention_nvfp4", "attention imported, for the q/gate split")
    recipe.assign(
        "text/layers/*/attention/*",
        format="nvfp4",
        method="import_encoded",
        policy="AllowA4",
        source="quantized",
    )
    recipe.assign("text/layers/*/attention/*_norm", format="bf16", policy="A16Only", source="base")
    out = tmp_path / "a.ninfer"
    specs = {"base": str(tiny_dense), "quantized": str(quantized)}
    convert(recipe, specs, out, components=("text",))
    with Artifact.open(out) as art:
        checked = check_nvfp4_words(art, q)
        assert {"text/layers/1/attention/query", "text/layers/1/attention/gate"} <= checked
        parents = {object_rows(art, f"text/layers/3/attention/{s}")[0] for s in ("query", "key")}
        assert len(parents) == 1  # q, k, gate, v share the q/k/v divisor: one parent
        assert art.binder_report.ok, art.binder_report.errors
    assert verify_against_source(out, specs, recipe)["errors"] == []


def test_qwen3_6_35b_a3b_nvfp4_stacks_expert_divisors(tmp_path, tiny_moe):
    sd = load_file(tiny_moe / "model.safetensors")
    out_sd, q = dict(sd), Quantizer("compressed-tensors")
    for p in _layers(sd):
        for e in range(4):
            for which in ("gate", "up", "down"):  # independent: every expert its own divisor
                q.nvfp4_group(out_sd, sd, [p + f"mlp.experts.{e}.{which}_proj.weight"])
        for which in ("gate", "up", "down"):
            q.nvfp4_group(out_sd, sd, [p + f"mlp.shared_expert.{which}_proj.weight"])
    quantized = write_checkpoint(tiny_moe, tmp_path / "ct", out_sd, "compressed-tensors")
    out = tmp_path / "moe.ninfer"
    specs = {"base": str(tiny_moe), "quantized": str(quantized)}
    convert("qwen3_6_35b_a3b_nvfp4", specs, out)
    check_artifact(out, specs, ext_all=True)
    with Artifact.open(out) as art:
        checked = check_nvfp4_words(art, q)
        assert len(checked) == 4 * (4 * 3 + 3)
        gate_up = art.objects[object_rows(art, "text/layers/2/moe/experts/0/gate")[0]]
        down = art.objects[object_rows(art, "text/layers/2/moe/experts/3/down")[0]]
        assert (gate_up.divisors, list(gate_up.shape)) == (8, [1024, 128])
        assert (down.divisors, list(down.shape)) == (4, [512, 128])
        # shared gate/up have different divisors: separate parents (the upstream rule)
        shared = {object_rows(art, f"text/layers/2/moe/shared/{s}")[0] for s in ("gate", "up")}
        assert len(shared) == 2
        divisors = activation_divisors(art)
        bank = [
            q.nvfp4[f"model.layers.2.mlp.experts.{e}.{w}_proj.weight"][3]
            for e in range(4)
            for w in ("gate", "up")
        ]
        site = ("text/layers/2/moe/experts/1/up", "text/layers/2/ffn_input")
        assert np.float32(divisors[site]) == min(bank)


def test_qwen3_8_27b_nvfp4_mixes_nvfp4_and_fp8(tmp_path, tiny_dense):
    sd = load_file(tiny_dense / "model.safetensors")
    out_sd, q = dict(sd), Quantizer("compressed-tensors")
    for p in _layers(sd):
        for which in ("gate", "up", "down"):  # gate and up quantized apart: two divisors
            q.nvfp4_group(out_sd, sd, [p + f"mlp.{which}_proj.weight"])
        for name in FP8_PROJECTIONS:
            if p + name in sd:
                q.fp8_row(out_sd, sd, p + name)
    q.fp8_row(out_sd, sd, "lm_head.weight", per_tensor=True)  # ModelOpt FP8 style: lossy
    out_sd["model.norm.weight"] = sd["model.norm.weight"] * 2  # must come from the quantized
    quantized = write_checkpoint(tiny_dense, tmp_path / "ct", out_sd, "compressed-tensors")
    out = tmp_path / "m.ninfer"
    specs = {"base": str(tiny_dense), "quantized": str(quantized)}
    report = convert("qwen3_8_27b_nvfp4", specs, out)
    result = check_artifact(out, specs)
    with Artifact.open(out) as art:
        assert len(check_nvfp4_words(art, q)) == 4 * 3
        gate, up = (object_rows(art, f"text/layers/0/mlp/{s}")[0] for s in ("gate", "up"))
        assert gate != up
        oid, a, b = object_rows(art, "text/layers/1/attention/gate")
        codes, words = unpack_fp8_row(art.raw(oid), tuple(art.objects[oid].shape))
        src_codes, src_words = q.fp8["model.layers.1.self_attn.q_proj.weight"]
        rows = source_rows("text/layers/1/attention/gate")[1]
        np.testing.assert_array_equal(codes[a:b], src_codes[rows])
        np.testing.assert_array_equal(words[a:b], src_words[rows])
        norm = art.parameter("text/final_norm")
        expected = bf16_to_f32(f32_to_bf16(out_sd["model.norm.weight"].numpy()))
        np.testing.assert_array_equal(norm, expected)
        head = art.objects[object_rows(art, "text/output_head")[0]]
        embedding = art.objects[object_rows(art, "text/token_embedding")[0]]
        assert head.format == embedding.format == "fp8_e4m3fn_row_bf16" and head is not embedding
        assert not activation_divisors(art).keys() - {
            (u.parameter, u.input) for u in art.uses if "/mlp/" in u.parameter
        }
    errors = {p.name: p.rmse for p in report.parameters}
    assert errors["text/layers/1/attention/query"] == 0 and errors["text/layers/0/mlp/up"] == 0
    assert errors["text/output_head"] > 0  # per-tensor F32 scale rounded to BF16 rows
    rows = {r["name"]: r for r in result["parameters"]}
    assert rows["text/final_norm"]["source"] == "quantized"
    assert rows["text/token_embedding"]["source"] == "base"


# --- errors -----------------------------------------------------------------------------------


def test_missing_quantized_source(tmp_path, tiny_dense):
    with pytest.raises(SourceError, match="--source quantized="):
        convert("qwen3_6_27b_nvfp4", {"base": str(tiny_dense)}, tmp_path / "x.ninfer")


def _variant(quantized: Path, tmp_path: Path, change) -> Path:
    out = tmp_path / "variant"
    shutil.copytree(quantized, out)
    tensors = load_file(out / "model.safetensors")
    change(tensors)
    save_file(tensors, out / "model.safetensors")
    return out


def _convert_variant(tmp_path, tiny_dense, variant) -> None:
    specs = {"base": str(tiny_dense), "quantized": str(variant)}
    convert("qwen3_6_27b_nvfp4", specs, tmp_path / "x.ninfer")


def test_allow_a4_needs_an_input_scale(tmp_path, tiny_dense, modelopt_dense):
    name = "model.layers.2.mlp.down_proj.input_scale"
    variant = _variant(modelopt_dense[0], tmp_path, lambda t: t.pop(name))
    with pytest.raises(RecipeError, match=r"mlp\.down_proj.*supply an activation divisor"):
        _convert_variant(tmp_path, tiny_dense, variant)
    assert not list(tmp_path.glob("x.ninfer*"))


def test_corrupt_scale_word_names_the_tensor(tmp_path, tiny_dense, modelopt_dense):
    name = "model.layers.0.mlp.down_proj.weight_scale"

    def corrupt(tensors):
        words = tensors[name].view(torch.uint8).clone()
        words[3, 5] = 0x7F
        tensors[name] = words.view(torch.float8_e4m3fn)

    variant = _variant(modelopt_dense[0], tmp_path, corrupt)
    with pytest.raises(RecipeError, match=rf"{name}.*NaN 0x7F.*\[3, 5\]"):
        _convert_variant(tmp_path, tiny_dense, variant)
    assert not list(tmp_path.glob("x.ninfer*"))


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("model.layers.0.mlp.up_proj.weight_scale_2", _f32(0.0), r"up_proj\.weight_scale_2.*inf"),
        (
            "model.layers.0.mlp.up_proj.weight_scale",
            torch.zeros(256, 8, dtype=torch.uint8),
            r"up_proj\.weight_scale \(NVFP4 block scales\) is U8",
        ),
    ],
)
def test_invalid_fields_name_the_tensor(tmp_path, tiny_dense, modelopt_dense, field, value, match):
    variant = _variant(modelopt_dense[0], tmp_path, lambda t: t.__setitem__(field, value))
    with pytest.raises(RecipeError, match=match):
        _convert_variant(tmp_path, tiny_dense, variant)
