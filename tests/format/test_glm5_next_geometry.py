"""The GLM5Next geometry and binder against transformers' own model: the binder's parameters
are exactly the text part of a tiny ``Glm5NextForConditionalGeneration``'s state dict (names
mapped, fused tensors split), the defaults and schedules are transformers', and each bad config
is one clear ``GeometryError``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_format.binders import bind, registered_model_types
from ninfer_format.binders.glm5_next import expected_parameters
from ninfer_format.binders.glm5_next_geometry import (
    DEFAULTS,
    INDEXED_ATTENTION,
    GeometryError,
    Glm5NextGeometry,
)
from ninfer_format.binders.qwen3_5 import Role
from tests.format.test_binders import Doc, directory
from tests.glm5_next_layout import (
    SIMPLE,  # noqa: F401  (the converter tests read it here)
    TEXT_PREFIX,
    TINY_VISION,
    text_parameters,
)

torch = pytest.importorskip("torch")
glm5 = pytest.importorskip("transformers.models.glm5_next.modeling_glm5_next")
from transformers import Glm5NextConfig, Glm5NextTextConfig  # noqa: E402

#: both token mixers, both FFN kinds, a shared-indexer attention layer after a full one
TINY: dict[str, Any] = dict(
    vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
    num_hidden_layers=5, num_attention_heads=2, num_key_value_heads=2, n_shared_experts=2,
    n_routed_experts=4, kv_lora_rank=8, q_lora_rank=12, qk_rope_head_dim=0, v_head_dim=6,
    qk_nope_head_dim=10, n_group=2, topk_group=1, num_experts_per_tok=2, index_topk=8,
    index_head_dim=8, index_n_heads=2, index_kpool=4, linear_head_dim=4, linear_num_heads=3,
    linear_conv_kernel_dim=3, hc_mult=2, pad_token_id=0,
    mlp_layer_types=["dense", "sparse", "sparse", "sparse", "dense"],
    layer_types=["linear_attention", "indexed_attention", "indexed_attention",
                 "linear_attention", "full_attention"],
    indexer_types=["full", "full", "shared", "full", "full"],
)  # fmt: skip


def _hf_to_ninfer(name: str, shape: tuple[int, ...], c: dict[str, Any]) -> dict[str, tuple]:
    """The shapes of the ninfer parameters one HF state-dict entry becomes."""
    value = np.zeros(shape, np.float32)
    return {k: v.shape for k, v in text_parameters(name, value, c).items()}


@pytest.fixture(scope="module")
def tiny() -> tuple[dict[str, tuple], dict[str, Any]]:
    torch.manual_seed(0)
    config = Glm5NextConfig(text_config=TINY, vision_config=TINY_VISION)
    model = glm5.Glm5NextForConditionalGeneration(config)
    text = config.text_config.to_dict()
    shapes = {
        name: tuple(tensor.shape)
        for name, tensor in model.state_dict().items()
        if name.startswith(TEXT_PREFIX) or name == "lm_head.weight"
    }
    return shapes, text


def test_binder_parameters_are_the_state_dict(tiny: tuple) -> None:
    shapes, config = tiny
    mapped: dict[str, tuple] = {}
    for name, shape in shapes.items():
        for logical, logical_shape in _hf_to_ninfer(name, shape, config).items():
            assert logical not in mapped, logical
            mapped[logical] = logical_shape
    expected = {spec.name: spec.shape for spec in expected_parameters(config)}
    assert expected == mapped
    # every block kind is present: KDA, MLA with and without its own indexer, dense and MoE
    for name in ("0/kda/query", "1/indexer/query", "2/mla/key_up", "1/moe/router", "4/mlp/up"):
        assert f"text/layers/{name}" in expected
    assert "text/layers/2/indexer/query" not in expected  # a shared layer reuses layer 1's


def test_geometry_reads_what_the_model_builds(tiny: tuple) -> None:
    _, config = tiny
    g = Glm5NextGeometry.from_config(config)
    assert g.layer_types[4] == INDEXED_ATTENTION  # full_attention means the same
    assert [g.runs_indexer(i) for i in range(5)] == [False, True, False, False, True]
    assert g.mla is not None and g.mla.qk_head_dim == 10 and g.mla.rope_dim == 0
    assert g.kda is not None and g.kda.conv_channels == 36 and g.kda.lower_bound == -5.0
    assert g.moe is not None and g.moe.shared_width == 32  # n_shared_experts · moe width
    assert g.routing is not None and (g.routing.groups, g.routing.topk_groups) == (2, 1)
    assert g.indexer is not None and g.indexer.pools_selected == 2
    assert g.hyper.weights == 8 and g.pad_token == 0


def test_defaults_and_derivations_are_transformers() -> None:
    defaults = Glm5NextTextConfig()
    assert {k: getattr(defaults, k) for k in DEFAULTS} == dict(DEFAULTS)
    g = Glm5NextGeometry.from_config({"num_hidden_layers": 9})
    hf = Glm5NextTextConfig(num_hidden_layers=9)
    assert list(g.layer_types) == hf.layer_types  # every fourth layer attention
    assert list(g.mlp_types) == hf.mlp_layer_types  # the first three dense
    assert list(g.indexer_types) == hf.indexer_types
    for derivation in ({"index_topk_freq": 2}, {"index_topk_freq": 2, "index_skip_topk_offset": 1},
                       {"index_topk_pattern": "FSFFSFSFF"}):  # fmt: skip
        config = {"num_hidden_layers": 9, "layer_types": ["indexed_attention"] * 9, **derivation}
        hf = Glm5NextTextConfig(**config)
        assert list(Glm5NextGeometry.from_config(config).indexer_types) == hf.indexer_types
    kimi = {"linear_attn_config": {"head_dim": 64, "num_heads": 8, "short_conv_kernel_size": 2,
                                   "gate_lower_bound": None}}  # fmt: skip
    hf = Glm5NextTextConfig(**kimi)
    kda = Glm5NextGeometry.from_config(kimi).kda
    assert kda is not None
    assert (kda.head_dim, kda.heads, kda.conv_kernel) == (64, 8, 2)
    assert kda.lower_bound == hf.linear_lower_bound == -5.0  # safe_gate restores the bound
    assert {"glm5_next", "glm5_next_text"} <= set(registered_model_types())


def _good_config() -> dict[str, Any]:
    """TINY as transformers saves it: every member spelled out."""
    config = Glm5NextTextConfig(**TINY).to_dict()
    Glm5NextGeometry.from_config(config)  # the baseline itself is good
    return config


BAD = [
    ({"num_key_value_heads": 1}, "num_key_value_heads' must equal num_attention_heads (2)"),
    ({"qk_rope_head_dim": 4}, "qk_rope_head_dim' must be 0"),
    ({"q_lora_rank": None}, "q_lora_rank' must be a positive integer"),
    ({"index_topk": 6}, "index_topk' (6) must be a multiple of index_kpool (4)"),
    ({"index_kpool": 0}, "index_kpool' must be a positive integer"),
    ({"n_group": 3}, "n_group' (3) must divide n_routed_experts (4)"),
    ({"n_group": 4}, "n_group' (4) leaves fewer than 2 experts a group"),
    ({"topk_group": 3}, "topk_group' (3) exceeds n_group (2)"),
    ({"num_experts_per_tok": 3}, "num_experts_per_tok' (3) exceeds the 2 experts of topk_group"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok' (5) exceeds n_routed_experts (4)"),
    ({"attention_bias": True}, "attention_bias' must be false"),
    ({"hidden_act": "gelu"}, "hidden_act' must be silu or swish"),
    ({"pad_token_id": 64}, "pad_token_id' must be null or a token id below vocab_size"),
    ({"linear_lower_bound": "low"}, "linear_lower_bound' must be a number"),
    ({"hc_sinkhorn_iters": 0}, "hc_sinkhorn_iters' must be a positive integer"),
    ({"mlp_layer_types": ["dense"] * 4}, "mlp_layer_types' has 4 entries but num_hidden_layers"),
    ({"layer_types": ["linear_attention"] * 4 + ["sliding"]}, "layer_types[4]' must be"),
    ({"indexer_types": ["full", "full", "shared", "full", "shared"]},
     "indexer_types' makes attention layers [4] shared"),
    ({"indexer_types": ["full"] * 4 + ["some"]}, "indexer_types[4]' must be full or shared"),
    ({"model_type": "glm4_moe"}, "model_type' must be glm5_next or glm5_next_text"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "line"), BAD, ids=[b[1].split("'")[0] + "'" for b in BAD])
def test_a_bad_config_is_one_clear_error(change: dict[str, Any], line: str) -> None:
    config = _good_config() | change
    with pytest.raises(GeometryError) as caught:
        Glm5NextGeometry.from_config(config)
    assert len(caught.value.problems) == 1, caught.value.problems
    assert line in caught.value.problems[0]


def test_unused_members_are_not_read_unless_the_mtp_block_needs_them() -> None:
    config = _good_config() | {
        "layer_types": ["linear_attention"] * 5,
        "mlp_layer_types": ["dense"] * 5,
        "q_lora_rank": None,
        "n_group": 3,
    }
    g = Glm5NextGeometry.from_config(config)
    assert g.mla is None and g.moe is None and g.indexer is None
    with pytest.raises(GeometryError) as caught:
        Glm5NextGeometry.from_config(config, with_mtp=True)
    named = " ".join(caught.value.problems)
    assert "'q_lora_rank' must be" in named and "'n_group' (3)" in named


def test_every_bad_member_is_named_at_once() -> None:
    config = _good_config() | {
        "hc_mult": 0,
        "index_topk": 5,
        "linear_num_heads": -1,
        "hidden_size": "wide",
    }
    with pytest.raises(GeometryError) as caught:
        Glm5NextGeometry.from_config(config)
    named = " ".join(caught.value.problems)
    for member in ("hc_mult", "index_topk", "linear_num_heads", "hidden_size"):
        assert f"'{member}'" in named
    assert "GLM5Next geometry" in str(caught.value)


def _artifact(config: dict[str, Any], drop: str | None = None) -> dict[str, Any]:
    """A directory document binding every expected parameter (fp32 where the role needs it)."""
    d = Doc()
    roles = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
    resources = {role: d.resource(role) for role in (*roles, "generation_config.json")}
    d.doc["components"]["text"] = {"config": config, "resources": resources}
    for spec in expected_parameters(config):
        if spec.name != drop:
            fmt = "fp32" if spec.role is Role.FP32_VECTOR else "bf16"
            d.param(spec.name, list(spec.shape), list(spec.inputs), fmt)
    return d.finish()


def test_an_artifact_binds_through_the_registry() -> None:
    config = _good_config() | {"architectures": ["Glm5NextForConditionalGeneration"]}
    report = bind(directory(_artifact(config)))
    assert report.binder == "glm5_next" and report.ok, report.errors
    assert report.parameters["text/layers/1/mla/key_up"] == (20, 8)
    broken = bind(directory(_artifact(config, drop="text/layers/0/kda/a_log")))
    assert broken.errors == ["text/layers/0/kda/a_log: not bound (expected shape [3])"]
