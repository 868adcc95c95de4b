"""Binder tests: small synthetic Qwen3.5 directories (payload never read) and the spec examples.

The expected name tables here are written out independently of the binder's own tables, so a
mistake in one is caught by the other. Every deliberate mistake must yield exactly one error.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from ninfer_format.binders import BinderReport, bind, register_binder
from ninfer_format.schema import Directory

EXAMPLES = Path("/work/shared/spec/examples")
if not EXAMPLES.is_dir():  # repository checkouts keep a copy beside the spec
    EXAMPLES = Path(__file__).resolve().parents[3] / "shared" / "spec" / "examples"

H, R = 64, 1000
NQ, NKV, D = 2, 1, 32
KG, VG, NV, DV, T = 32, 64, 4, 16, 4
I_DENSE = 96
E, IR, IS = 4, 32, 48
ROWS = 16
# vision tower: hidden, MLP width, heads, patch, temporal patch, merge, positions, depth
VH, VI, VHEADS, PS, PT, MERGE, NPOS, DEPTH = 32, 48, 2, 2, 2, 2, 16, 2
M = MERGE * MERGE * VH  # merger width

ELEMENT_BYTES = {"bf16": 2, "fp32": 4, "int32": 4}
LAYOUT = {
    "bf16": "contiguous_le_v1",
    "fp32": "contiguous_le_v1",
    "int32": "contiguous_le_v1",
    "q4_g64_fp16": "row_split_k128_v1",
    "nvfp4": "block_scale_k16_m128x4_v1",
    "gguf_q4_0": "gguf_blocks_v1",
    "t2_g128_fp16": "row_split_k128_v1",
}


def text_config(moe: bool = False) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "hidden_size": H,
        "vocab_size": R,
        "num_hidden_layers": 2,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-06,
        "layer_types": ["linear_attention", "full_attention"],
        "num_attention_heads": NQ,
        "num_key_value_heads": NKV,
        "head_dim": D,
        "rope_parameters": {
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
        },
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_num_value_heads": NV,
        "linear_value_head_dim": DV,
        "linear_conv_kernel_dim": T,
    }
    if moe:
        config.update(
            num_experts=E,
            num_experts_per_tok=2,
            moe_intermediate_size=IR,
            shared_expert_intermediate_size=IS,
        )
    else:
        config["intermediate_size"] = I_DENSE
    return config


# (name, shape, use inputs, format) rows, spelled out from spec 5.2/5.3/5.6
Row = tuple[str, list[int], list[str], str]


def ffn_rows(p: str, moe: bool) -> list[Row]:
    x = p + "ffn_input"
    if not moe:
        return [
            (p + "mlp/gate", [I_DENSE, H], [x], "bf16"),
            (p + "mlp/up", [I_DENSE, H], [x], "bf16"),
            (p + "mlp/down", [H, I_DENSE], [p + "mlp/product"], "bf16"),
        ]
    rows: list[Row] = [
        (p + "moe/router", [E, H], [x], "bf16"),
        (p + "moe/shared_score", [1, H], [x], "bf16"),
        (p + "moe/shared/gate", [IS, H], [x], "bf16"),
        (p + "moe/shared/up", [IS, H], [x], "bf16"),
        (p + "moe/shared/down", [H, IS], [p + "moe/shared/product"], "bf16"),
    ]
    for e in range(E):
        q = f"{p}moe/experts/{e}/"
        rows += [
            (q + "gate", [IR, H], [x], "bf16"),
            (q + "up", [IR, H], [x], "bf16"),
            (q + "down", [H, IR], [q + "product"], "bf16"),
        ]
    return rows


def attention_layer(p: str, moe: bool) -> list[Row]:
    x = p + "mixer_input"
    return [
        (p + "input_norm", [H], [], "bf16"),
        (p + "post_attention_norm", [H], [], "bf16"),
        (p + "attention/query", [NQ * D, H], [x], "bf16"),
        (p + "attention/gate", [NQ * D, H], [x], "bf16"),
        (p + "attention/key", [NKV * D, H], [x], "bf16"),
        (p + "attention/value", [NKV * D, H], [x], "bf16"),
        (p + "attention/query_norm", [D], [], "bf16"),
        (p + "attention/key_norm", [D], [], "fp32"),
        (p + "attention/output", [H, NQ * D], [p + "attention/gated_output"], "bf16"),
        *ffn_rows(p, moe),
    ]


def gdn_layer(p: str, moe: bool) -> list[Row]:
    x = p + "mixer_input"
    return [
        (p + "input_norm", [H], [], "bf16"),
        (p + "post_attention_norm", [H], [], "bf16"),
        (p + "gdn/a_log", [NV], [], "fp32"),
        (p + "gdn/dt_bias", [NV], [], "fp32"),
        (p + "gdn/convolution", [T, 2 * KG + VG], [], "bf16"),
        (p + "gdn/a_projection", [NV, H], [x], "bf16"),
        (p + "gdn/b_projection", [NV, H], [x], "bf16"),
        (p + "gdn/query", [KG, H], [x], "bf16"),
        (p + "gdn/key", [KG, H], [x], "bf16"),
        (p + "gdn/value", [VG, H], [x], "bf16"),
        (p + "gdn/z", [VG, H], [x], "bf16"),
        (p + "gdn/norm", [DV], [], "bf16"),
        (p + "gdn/output", [H, VG], [p + "gdn/gated_output"], "bf16"),
        *ffn_rows(p, moe),
    ]


def model_rows(moe: bool, mtp: bool, proposal: bool) -> list[Row]:
    head_inputs = ["text/final_hidden"] + (["mtp/final_hidden"] if mtp else [])
    rows: list[Row] = [
        ("text/token_embedding", [R, H], [], "bf16"),
        ("text/output_head", [R, H], head_inputs, "bf16"),
        ("text/final_norm", [H], [], "bf16"),
        *gdn_layer("text/layers/0/", moe),
        *attention_layer("text/layers/1/", moe),
    ]
    if mtp:
        rows += [
            ("mtp/input_projection", [H, 2 * H], ["mtp/stem_input"], "bf16"),
            ("mtp/embedding_norm", [H], [], "bf16"),
            ("mtp/hidden_norm", [H], [], "bf16"),
            ("mtp/final_norm", [H], [], "bf16"),
            *attention_layer("mtp/layers/0/", moe),
        ]
    if proposal:
        rows += [
            ("proposal/head", [ROWS, H], ["mtp/final_hidden"] if mtp else [], "bf16"),
            ("proposal/token_ids", [ROWS], [], "int32"),
        ]
    return rows


def vision_config(moe: bool = False) -> dict[str, Any]:
    return {
        "model_type": "qwen3_5_moe_vision" if moe else "qwen3_5_vision",
        "depth": DEPTH,
        "hidden_size": VH,
        "intermediate_size": VI,
        "num_heads": VHEADS,
        "patch_size": PS,
        "temporal_patch_size": PT,
        "spatial_merge_size": MERGE,
        "num_position_embeddings": NPOS,
    }


def vision_rows() -> list[Row]:
    """Spec 5.4, written out: every vector bf16, every matrix bf16."""
    rows: list[Row] = [
        ("vision/patch_embedding", [VH, 3 * PT * PS * PS], ["vision/patch_input"], "bf16"),
        ("vision/patch_embedding_bias", [VH], [], "bf16"),
        ("vision/position_embedding", [NPOS, VH], [], "bf16"),
    ]
    for i in range(DEPTH):
        v = f"vision/layers/{i}/"
        rows += [(v + n, [VH], [], "bf16") for n in ("norm1_weight", "norm1_bias")]
        rows += [(v + n, [VH], [], "bf16") for n in ("norm2_weight", "norm2_bias")]
        for p in ("query", "key", "value"):
            rows.append((f"{v}attention/{p}", [VH, VH], [v + "attention_input"], "bf16"))
            rows.append((f"{v}attention/{p}_bias", [VH], [], "bf16"))
        rows += [
            (v + "attention/output", [VH, VH], [v + "attention_output"], "bf16"),
            (v + "attention/output_bias", [VH], [], "bf16"),
            (v + "mlp/fc1", [VI, VH], [v + "mlp_input"], "bf16"),
            (v + "mlp/fc1_bias", [VI], [], "bf16"),
            (v + "mlp/fc2", [VH, VI], [v + "mlp_activation"], "bf16"),
            (v + "mlp/fc2_bias", [VH], [], "bf16"),
        ]
    rows += [
        ("vision/merger/norm_weight", [VH], [], "bf16"),
        ("vision/merger/norm_bias", [VH], [], "bf16"),
        ("vision/merger/fc1", [M, M], ["vision/merger/input"], "bf16"),
        ("vision/merger/fc1_bias", [M], [], "bf16"),
        ("vision/merger/fc2", [H, M], ["vision/merger/activation"], "bf16"),
        ("vision/merger/fc2_bias", [H], [], "bf16"),
    ]
    return rows


class Doc:
    """A directory document under construction: objects get sequential fake offsets."""

    def __init__(self) -> None:
        self.doc: dict[str, Any] = {"components": {}, "objects": [], "bindings": {}, "uses": []}
        self.end = 0
        self.count = 0

    def tensor(self, shape: list[int], fmt: str = "bf16") -> str:
        object_id = f"w.{self.count:04d}"
        self.count += 1
        offset = -(-self.end // 256) * 256
        size = math.prod(shape) * ELEMENT_BYTES.get(fmt, 1)
        self.doc["objects"].append(
            {
                "id": object_id,
                "kind": "tensor",
                "shape": shape,
                "format": fmt,
                "layout": LAYOUT[fmt],
                "offset": offset,
                "bytes": size,
            }
        )
        self.end = offset + size
        return object_id

    def resource(self, role: str) -> str:
        object_id = f"r.{role}"
        self.doc["objects"].append(
            {
                "id": object_id,
                "kind": "resource",
                "encoding": "raw_bytes_v1",
                "offset": self.end,
                "bytes": 10,
            }
        )
        self.end += 10
        return object_id

    def param(self, name: str, shape: list[int], inputs: list[str], fmt: str) -> None:
        self.doc["bindings"][name] = {"object": self.tensor(shape, fmt)}
        for site in inputs:
            self.doc["uses"].append(
                {"parameter": name, "input": site, "activation_policy": "A16Only"}
            )

    def finish(self) -> dict[str, Any]:
        self.doc["files"] = [{"path": None, "payload_bytes": max(self.end, 1)}]
        return self.doc


def make_doc(
    moe: bool = False, mtp: bool = False, proposal: bool = False, vision: bool = False
) -> dict[str, Any]:
    d = Doc()
    roles = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
    roles.append("generation_config.json")
    text: dict[str, Any] = {
        "config": text_config(moe),
        "resources": {role: d.resource(role) for role in roles},
    }
    if proposal:
        text["proposal"] = {"domain": "indexed", "rows": ROWS}
    d.doc["components"]["text"] = text
    if mtp:
        arch = "Qwen3_5MoeMTP" if moe else "Qwen3_5MTP"
        d.doc["components"]["mtp"] = {"config": {"architectures": [arch]}, "target": "text"}
    rows = model_rows(moe, mtp, proposal)
    if vision:
        d.doc["components"]["vision"] = {
            "config": vision_config(moe),
            "target": "text",
            "resources": {"preprocessor_config.json": d.resource("preprocessor_config.json")},
        }
        rows += vision_rows()
    for row in rows:
        d.param(*row)
    return d.finish()


def directory(doc: dict[str, Any]) -> Directory:
    return Directory.model_validate_json(json.dumps(doc))


def run(doc: dict[str, Any]) -> BinderReport:
    return bind(directory(doc))


def object_of(doc: dict[str, Any], name: str) -> dict[str, Any]:
    object_id = doc["bindings"][name]["object"]
    return next(o for o in doc["objects"] if o["id"] == object_id)


def use_of(doc: dict[str, Any], name: str, site: str | None = None) -> dict[str, Any]:
    return next(
        u for u in doc["uses"] if u["parameter"] == name and (site is None or u["input"] == site)
    )


def set_format(doc: dict[str, Any], name: str, fmt: str) -> None:
    obj = object_of(doc, name)
    obj["format"], obj["layout"] = fmt, LAYOUT[fmt]


def add_scalar(doc: dict[str, Any], shape: list[int]) -> str:
    """Append an fp32 object after the current payload end; returns its ID."""
    end = doc["files"][0]["payload_bytes"]
    offset = -(-end // 256) * 256
    size = 4 * math.prod(shape)
    object_id = f"aux.{len(doc['objects'])}"
    doc["objects"].append(
        {
            "id": object_id,
            "kind": "tensor",
            "shape": shape,
            "format": "fp32",
            "layout": "contiguous_le_v1",
            "offset": offset,
            "bytes": size,
        }
    )
    doc["files"][0]["payload_bytes"] = offset + size
    return object_id


def single_error(report: BinderReport, *fragments: str) -> str:
    assert len(report.errors) == 1, report.errors
    for fragment in fragments:
        assert fragment in report.errors[0], report.errors[0]
    return report.errors[0]


# --- valid directories --------------------------------------------------------------------


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("mtp", [False, True], ids=["", "mtp"])
@pytest.mark.parametrize("proposal", [False, True], ids=["", "proposal"])
def test_valid_directories_bind_cleanly(moe: bool, mtp: bool, proposal: bool) -> None:
    report = run(make_doc(moe, mtp, proposal))
    assert report.ok and report.errors == []
    assert report.binder == "qwen3_5"
    assert report.architecture == ("qwen3_5_moe_text" if moe else "qwen3_5_text")
    if proposal and not mtp:
        assert report.warnings == ["text has an indexed proposal but no drafter component reads it"]
    else:
        assert report.warnings == []
    expected = {name: tuple(shape) for name, shape, _, _ in model_rows(moe, mtp, proposal)}
    assert report.parameters == expected


@pytest.mark.parametrize("name", ["artifact-v3-text.json", "artifact-v3-mixed-sharded.json"])
def test_spec_examples_bind_cleanly(name: str) -> None:
    doc = json.loads((EXAMPLES / name).read_text())
    if "files" not in doc:
        end = max(o["offset"] + o["bytes"] for o in doc["objects"])
        doc["files"] = [{"path": None, "payload_bytes": end}]
    report = run(doc)
    assert (report.errors, report.warnings) == ([], [])
    assert report.parameters["text/layers/0/attention/query"] == (128, 128)
    assert report.parameters["text/layers/0/mlp/down"] == (128, 256)


def test_parts_bindings_with_packed_parents_bind_cleanly() -> None:
    doc = make_doc()
    parent = next(
        o for o in doc["objects"] if o["id"] == doc["bindings"]["text/final_norm"]["object"]
    )
    parent_id = parent["id"]
    # Use the [H] final norm's object as two halves of itself, and pack gdn q/k into one parent.
    doc["bindings"]["text/final_norm"] = {
        "parts": [
            {"object": parent_id, "range": [0, H // 2]},
            {"object": parent_id, "range": [H // 2, H]},
        ]
    }
    q = object_of(doc, "text/layers/0/gdn/query")
    q["shape"] = [2 * KG, H]
    doc["bindings"]["text/layers/0/gdn/query"] = {
        "parts": [{"object": q["id"], "range": [0, KG * H]}]
    }
    doc["bindings"]["text/layers/0/gdn/key"] = {
        "parts": [{"object": q["id"], "range": [KG * H, 2 * KG * H]}]
    }
    assert run(doc).errors == []


def test_model_type_absent_falls_back_to_architectures() -> None:
    doc = make_doc(moe=True)
    del doc["components"]["text"]["config"]["model_type"]
    report = run(doc)
    assert report.ok and report.architecture == "qwen3_5_moe_text" and report.binder == "qwen3_5"
    assert any("no model_type" in w for w in report.warnings)


# --- unknown architectures ------------------------------------------------------------------


def test_unknown_architecture_is_reported_not_an_error() -> None:
    doc = make_doc()
    doc["components"]["text"]["config"]["model_type"] = "llama"
    report = run(doc)
    assert report.binder is None and report.architecture == "llama"
    assert report.ok and report.parameters == {}
    assert report.warnings and "no binder" in report.warnings[0]


def test_register_binder_dispatches_new_model_types() -> None:
    seen: list[str] = []

    @register_binder("test_only_toy", architectures={"ToyForCausalLM": "test_only_toy"})
    def toy(directory: Directory, model_type: str, findings: Any) -> None:
        seen.append(model_type)
        findings.error("toy says no")

    doc = make_doc()
    config = doc["components"]["text"]["config"]
    del config["model_type"]
    config["architectures"] = ["ToyForCausalLM"]
    report = run(doc)
    assert (report.binder, report.architecture, report.errors) == (
        "toy",
        "test_only_toy",
        ["toy says no"],
    )
    assert seen == ["test_only_toy"]
    with pytest.raises(ValueError):
        register_binder("test_only_toy")(toy)


# --- deliberate mistakes: exactly one error each -------------------------------------------


def test_missing_parameter() -> None:
    doc = make_doc()
    name = "text/layers/1/attention/key"
    del doc["bindings"][name]
    doc["uses"] = [u for u in doc["uses"] if u["parameter"] != name]
    single_error(run(doc), name, "not bound", "[32, 64]")


def test_wrong_whole_object_shape() -> None:
    doc = make_doc()
    object_of(doc, "text/layers/0/gdn/z")["shape"] = [VG, H + 1]
    single_error(run(doc), "text/layers/0/gdn/z", "[64, 65]", "[64, 64]")


def test_parts_total_wrong() -> None:
    doc = make_doc()
    name = "text/layers/1/mlp/up"
    obj = object_of(doc, name)
    doc["bindings"][name] = {"parts": [{"object": obj["id"], "range": [0, I_DENSE * H - 1]}]}
    single_error(run(doc), name, "parts total 6143", "6144")


def test_norm_stored_q4() -> None:
    doc = make_doc()
    set_format(doc, "text/layers/0/input_norm", "q4_g64_fp16")
    single_error(run(doc), "text/layers/0/input_norm", "q4_g64_fp16", "bf16 or fp32")


def test_a_log_bf16() -> None:
    doc = make_doc()
    set_format(doc, "text/layers/0/gdn/a_log", "bf16")
    single_error(run(doc), "text/layers/0/gdn/a_log", "fp32")


def test_matrix_int32() -> None:
    doc = make_doc()
    set_format(doc, "text/layers/0/gdn/value", "int32")
    single_error(run(doc), "text/layers/0/gdn/value", "int32")


def test_quantized_matrices_are_allowed() -> None:
    doc = make_doc()
    set_format(doc, "text/layers/1/attention/query", "q4_g64_fp16")
    set_format(doc, "text/layers/0/mlp/down", "gguf_q4_0")
    set_format(doc, "text/output_head", "nvfp4")
    assert run(doc).errors == []


def test_unknown_matrix_format_is_a_warning() -> None:
    doc = make_doc()
    set_format(doc, "text/layers/0/gdn/query", "t2_g128_fp16")
    report = run(doc)
    assert report.ok
    assert len(report.warnings) == 1 and "t2_g128_fp16" in report.warnings[0]


def test_token_ids_must_be_int32_whole_object() -> None:
    doc = make_doc(mtp=True, proposal=True)
    set_format(doc, "proposal/token_ids", "bf16")
    single_error(run(doc), "proposal/token_ids", "int32")
    doc = make_doc(mtp=True, proposal=True)
    obj = object_of(doc, "proposal/token_ids")
    doc["bindings"]["proposal/token_ids"] = {"parts": [{"object": obj["id"], "range": [0, ROWS]}]}
    single_error(run(doc), "proposal/token_ids", "whole int32 object")


def test_missing_use() -> None:
    doc = make_doc()
    doc["uses"].remove(use_of(doc, "text/layers/0/gdn/output"))
    single_error(
        run(doc), "use text/layers/0/gdn/output @ text/layers/0/gdn/gated_output", "missing"
    )


def test_missing_mtp_head_use() -> None:
    doc = make_doc(mtp=True)
    doc["uses"].remove(use_of(doc, "text/output_head", "mtp/final_hidden"))
    single_error(run(doc), "use text/output_head @ mtp/final_hidden: missing")


def test_use_with_undefined_input() -> None:
    doc = make_doc()
    doc["uses"].append(
        {
            "parameter": "text/layers/1/attention/query",
            "input": "text/final_hidden",
            "activation_policy": "A16Only",
        }
    )
    single_error(run(doc), "text/layers/1/attention/query @ text/final_hidden", "not defined")
    doc = make_doc()  # a dflash input on the head without a dflash component
    doc["uses"].append(
        {
            "parameter": "text/output_head",
            "input": "dflash/final_hidden",
            "activation_policy": "A16Only",
        }
    )
    single_error(run(doc), "dflash/final_hidden", "not defined")


def test_unexpected_parameters() -> None:
    doc = make_doc()
    doc["bindings"]["text/layers/0/attention/query"] = {
        "object": object_of(doc, "text/final_norm")["id"]
    }
    single_error(run(doc), "text/layers/0/attention/query", "not a parameter")
    doc = make_doc()  # MTP weights without an mtp component
    doc["bindings"]["mtp/final_norm"] = {"object": object_of(doc, "text/final_norm")["id"]}
    single_error(run(doc), "mtp/final_norm", "no mtp component")
    doc = make_doc()  # a parameter of a component that does not exist
    doc["bindings"]["vision/merger/fc1"] = {"object": object_of(doc, "text/final_norm")["id"]}
    single_error(run(doc), "vision/merger/fc1", "no component 'vision'")


def test_dflash_is_not_checked() -> None:
    doc = make_doc()
    doc["components"]["dflash"] = {"config": {"model_type": "qwen3"}, "target": "text"}
    doc["bindings"]["dflash/anything"] = {"object": object_of(doc, "text/final_norm")["id"]}
    head_use = {"parameter": "text/output_head", "input": "dflash/final_hidden"}
    doc["uses"].append({**head_use, "activation_policy": "A16Only"})
    report = run(doc)
    assert report.errors == []
    assert report.warnings == [
        "component 'dflash' (1 bound parameters): not checked by this binder"
    ]


# --- vision (spec 5.1, 5.4, 5.7) -----------------------------------------------------------


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_valid_vision_directory_binds_cleanly(moe: bool) -> None:
    report = run(make_doc(moe=moe, mtp=True, vision=True))
    assert (report.errors, report.warnings) == ([], [])
    for name, shape, _, _ in vision_rows():
        assert report.parameters[name] == tuple(shape)


def test_vision_quantized_matrices_are_allowed() -> None:
    doc = make_doc(vision=True)
    set_format(doc, "vision/patch_embedding", "q4_g64_fp16")
    set_format(doc, "vision/merger/fc2", "nvfp4")
    assert run(doc).errors == []


def test_wrong_vision_shape() -> None:
    doc = make_doc(vision=True)
    object_of(doc, "vision/merger/fc2")["shape"] = [VH, M]  # vision width instead of text H
    single_error(run(doc), "vision/merger/fc2", f"[{VH}, {M}]", f"[{H}, {M}]")
    doc = make_doc(vision=True)
    object_of(doc, "vision/patch_embedding")["shape"] = [VH, PT * PS * PS]  # one channel only
    single_error(run(doc), "vision/patch_embedding", f"[{VH}, {3 * PT * PS * PS}]")


def test_vision_bias_stored_q4() -> None:
    doc = make_doc(vision=True)
    set_format(doc, "vision/layers/1/attention/key_bias", "q4_g64_fp16")
    single_error(run(doc), "vision/layers/1/attention/key_bias", "bf16 or fp32")


def test_missing_and_unexpected_vision_parameters() -> None:
    doc = make_doc(vision=True)
    name = "vision/layers/1/mlp/fc2"
    del doc["bindings"][name]
    doc["uses"] = [u for u in doc["uses"] if u["parameter"] != name]
    single_error(run(doc), name, "not bound", f"[{VH}, {VI}]")
    doc = make_doc(vision=True)  # a block beyond the configured depth
    doc["bindings"]["vision/layers/2/norm1_weight"] = {
        "object": object_of(doc, "vision/layers/1/norm1_weight")["id"]
    }
    single_error(run(doc), "vision/layers/2/norm1_weight", "not a parameter")


def test_missing_vision_use() -> None:
    doc = make_doc(vision=True)
    doc["uses"].remove(use_of(doc, "vision/layers/0/attention/value"))
    single_error(
        run(doc), "use vision/layers/0/attention/value @ vision/layers/0/attention_input", "missing"
    )


@pytest.mark.parametrize(
    ("member", "value", "fragment"),
    [
        ("model_type", "qwen3_5_moe_vision", "'model_type' must be \"qwen3_5_vision\""),
        ("num_heads", 3, f"'hidden_size' ({VH}) must be a multiple of num_heads (3)"),
        ("out_hidden_size", VH, f"'out_hidden_size' must be {H} when present"),
        ("in_channels", 4, "'in_channels' must be 3 when present"),
    ],
)
def test_vision_config_errors(member: str, value: Any, fragment: str) -> None:
    doc = make_doc(vision=True)
    doc["components"]["vision"]["config"][member] = value
    single_error(run(doc), "vision config member", fragment)


def test_vision_config_without_geometry_skips_its_parameters() -> None:
    doc = make_doc(vision=True)
    del doc["components"]["vision"]["config"]["depth"]
    report = run(doc)
    single_error(report, "vision config member 'depth' is missing")
    assert report.warnings == [
        "vision parameters were not checked: the vision config lacks its geometry"
    ]


def test_vision_target_and_resources() -> None:
    doc = make_doc(vision=True)
    del doc["components"]["vision"]["target"]
    single_error(run(doc), 'vision component must have target "text"')
    doc = make_doc(vision=True)
    resources = doc["components"]["vision"]["resources"]
    resources["processor.json"] = resources.pop("preprocessor_config.json")
    report = run(doc)
    assert report.errors == []
    assert report.warnings == [
        "vision resource 'preprocessor_config.json' is absent; frontends need it",
        "vision resource role 'processor.json' is not one the Qwen3.5 frontend reads",
    ]


def test_allow_a4_on_q4_weight() -> None:
    doc = make_doc()
    name = "text/layers/1/mlp/gate"
    set_format(doc, name, "q4_g64_fp16")
    use = use_of(doc, name)
    use["activation_policy"] = "AllowA4"
    use["auxiliaries"] = {"activation_input_divisor": {"object": add_scalar(doc, [])}}
    single_error(run(doc), name, "AllowA4", "q4_g64_fp16", "cannot serve A4")


def test_allow_a4_on_nvfp4_weight() -> None:
    doc = make_doc()
    name = "text/layers/1/mlp/gate"
    set_format(doc, name, "nvfp4")
    use = use_of(doc, name)
    use["activation_policy"] = "AllowA4"
    assert run(doc).errors == [
        "use text/layers/1/mlp/gate @ text/layers/1/ffn_input:"
        " AllowA4 needs an activation_input_divisor auxiliary"
    ]
    use["auxiliaries"] = {"activation_input_divisor": {"object": add_scalar(doc, [])}}
    assert run(doc).errors == []
    vector = add_scalar(doc, [2])  # a single-element Part of an fp32 vector is also fine
    use["auxiliaries"] = {
        "activation_input_divisor": {"parts": [{"object": vector, "range": [1, 2]}]}
    }
    assert run(doc).errors == []


def test_divisor_bound_to_a_vector() -> None:
    doc = make_doc()
    name = "text/layers/1/mlp/gate"
    set_format(doc, name, "nvfp4")
    use = use_of(doc, name)
    use["activation_policy"] = "AllowA4"
    use["auxiliaries"] = {"activation_input_divisor": {"object": add_scalar(doc, [2])}}
    single_error(run(doc), "activation_input_divisor", "fp32 scalar", "[2]")


def test_auxiliary_roles() -> None:
    doc = make_doc()
    name = "text/layers/1/mlp/down"
    use = use_of(doc, name)
    use["auxiliaries"] = {"mystery": {"object": add_scalar(doc, [])}}
    single_error(run(doc), "unknown auxiliary role 'mystery'")
    columns = add_scalar(doc, [I_DENSE])
    next(o for o in doc["objects"] if o["id"] == columns)["format"] = "int32"
    use["auxiliaries"] = {"input_columns": {"object": columns}}
    single_error(run(doc), "input_columns only applies to gguf_* weights")
    set_format(doc, name, "gguf_q4_0")
    assert run(doc).errors == []
    use["auxiliaries"] = {"hadamard_signs": {"object": add_scalar(doc, [I_DENSE])}}
    single_error(run(doc), "hadamard_signs must be bf16 [96]")


def test_missing_activation_policy_is_a_warning() -> None:
    doc = make_doc()
    del use_of(doc, "text/output_head")["activation_policy"]
    report = run(doc)
    assert report.ok
    assert report.warnings == [
        "use text/output_head @ text/final_hidden: no activation_policy (the binder requires"
        " one; A16Only is the safe reading)"
    ]


def test_mtp_architecture_must_match_text_variant() -> None:
    doc = make_doc(mtp=True)
    doc["components"]["mtp"]["config"]["architectures"] = ["Qwen3_5MoeMTP"]
    single_error(run(doc), "mtp config member 'architectures'", "Qwen3_5MTP")


# --- config problems -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("member", "value", "fragment"),
    [
        (
            "layer_types",
            ["full_attention"],
            "'layer_types' has 1 entries but num_hidden_layers is 2",
        ),
        ("layer_types", ["full_attention", "sliding"], "'layer_types[1]'"),
        ("hidden_size", "64", "'hidden_size' must be a positive integer"),
        ("hidden_size", 64.0, "'hidden_size' must be a positive integer"),
        ("tie_word_embeddings", 0, "'tie_word_embeddings' must be true or false"),
        ("rope_parameters", [], "'rope_parameters' must be an object"),
        ("num_key_value_heads", 3, "'num_attention_heads' (2) must be a multiple"),
        ("linear_conv_kernel_dim", None, "'linear_conv_kernel_dim' must be a positive integer"),
    ],
)
def test_config_member_errors(member: str, value: Any, fragment: str) -> None:
    doc = make_doc()
    doc["components"]["text"]["config"][member] = value
    report = run(doc)
    single_error(report, fragment)
    assert report.parameters == {}
    assert any("parameters were not checked" in w for w in report.warnings)


def test_config_nested_and_missing_members() -> None:
    doc = make_doc()
    doc["components"]["text"]["config"]["rope_parameters"]["mrope_section"] = [2, 2]
    single_error(run(doc), "'rope_parameters.mrope_section' must be a list of 3")
    doc = make_doc()
    doc["components"]["text"]["config"]["rope_parameters"]["mrope_section"] = [2, 2, 2]
    single_error(run(doc), "'rope_parameters.mrope_section' covers 12 rotated dims", "= 8")
    doc = make_doc()
    del doc["components"]["text"]["config"]["head_dim"]
    single_error(run(doc), "'head_dim' is missing (full-attention layers need it)")
    doc = make_doc(moe=True)
    del doc["components"]["text"]["config"]["num_experts"]
    single_error(run(doc), "'num_experts' is missing")


def test_attention_members_are_optional_without_attention_layers() -> None:
    doc = make_doc()
    config = doc["components"]["text"]["config"]
    config["layer_types"] = ["linear_attention", "linear_attention"]
    for key in ("num_attention_heads", "num_key_value_heads", "head_dim", "rope_parameters"):
        del config[key]
    report = run(doc)
    # layer 1 now expects GDN names: its attention names are unexpected, its GDN names missing
    assert any("text/layers/1/gdn/z: not bound" in e for e in report.errors)
    assert not any("config member" in e for e in report.errors)


ODD_VALUES = [
    None,
    True,
    -1,
    0,
    1.5,
    1e308,
    "x",
    [],
    {},
    [1, 2, 3],
    [1, "a", None],
    10**30,
    10**400,
]


def test_binder_never_raises_on_odd_configs() -> None:
    base_doc = make_doc(moe=True, mtp=True, proposal=True)
    base = directory(base_doc)  # validated once; only the text config varies below
    text = base.components["text"]
    rope = [f"rope_parameters.{key}" for key in text.config["rope_parameters"]]
    for member in [*text.config, *rope]:
        for value in ODD_VALUES:
            config = copy.deepcopy(text.config)
            *parents, key = member.split(".")
            target = config
            for parent in parents:
                target = target[parent]
            target[key] = value
            components = {**base.components, "text": text.model_copy(update={"config": config})}
            report = bind(base.model_copy(update={"components": components}))
            assert not any("failed internally" in e for e in report.errors), (member, value)
            if report.binder is not None and value in ("x", [], {}) and member != "architectures":
                assert not report.ok, (member, value)  # a wrong JSON type is always an error
    doc = copy.deepcopy(base_doc)
    doc["components"]["text"]["config"] = {}
    assert run(doc).binder is None
    doc["components"]["mtp"]["config"] = {"architectures": 5}
    assert run(doc).ok


def test_huge_expert_count_is_an_error_not_a_hang() -> None:
    doc = make_doc(moe=True)
    doc["components"]["text"]["config"]["num_experts"] = 10**12
    doc["components"]["text"]["config"]["num_experts_per_tok"] = 2
    single_error(run(doc), "implies more than")
