"""The one Qwen3.5 geometry: what it reads from the repository's tiny configs and the benchmark
geometries, the defaults and derivations it applies, and that a bad config is one clear error
(the binder, the runtime and the converter all read through it)."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest

from ninfer_format.binders.qwen3_5 import expected_parameters
from ninfer_format.binders.qwen3_5_geometry import (
    DENSE,
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    MOE,
    Attention,
    DenseMlp,
    Gdn,
    GeometryError,
    Moe,
    Qwen35Geometry,
    layer_types_for_interval,
)
from ninfer_runtime.bench.geometries import GEOMETRIES, geometry
from ninfer_runtime.errors import ModelError
from ninfer_runtime.models.qwen3_5.config import Qwen35Config
from tests.bundled import BUNDLED

TINY = BUNDLED / "config.json"
L, F = LINEAR_ATTENTION, FULL_ATTENTION


def tiny_config() -> dict[str, Any]:
    return json.loads(TINY.read_text())


def tiny_moe_config() -> dict[str, Any]:
    """The MoE variant tests build as a checkpoint (tests/tiny_checkpoints.py)."""
    config = tiny_config()
    del config["intermediate_size"]
    config.update(
        model_type=MOE,
        architectures=["Qwen3_5MoeForCausalLM"],
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
    )
    return config


TINY_ATTENTION = Attention(
    heads=2, kv_heads=1, head_dim=64, rotary_dim=16, rope_theta=1e7, mrope_section=(4, 2, 2)
)
TINY_GDN = Gdn(key_heads=2, key_dim=32, value_heads=4, value_dim=64, conv_kernel=4)


def test_the_tiny_dense_config() -> None:
    g = Qwen35Geometry.from_config(tiny_config())
    assert (g.model_type, g.hidden, g.vocab, g.layers) == (DENSE, 128, 512, 4)
    assert g.layer_types == (L, F, L, F) and g.full_attention_interval == 2
    assert (g.eps, g.tie_word_embeddings, g.max_positions) == (1e-6, False, 4096)
    assert g.attention == TINY_ATTENTION
    assert g.gdn == TINY_GDN
    widths = (g.gdn.key_width, g.gdn.value_width, g.gdn.conv_channels, g.gdn.ratio)
    assert widths == (64, 256, 384, 2)
    assert g.ffn == DenseMlp(256) and g.moe is None


def test_the_tiny_moe_config() -> None:
    g = Qwen35Geometry.from_config(tiny_moe_config())
    assert g.model_type == MOE
    assert g.moe == g.ffn == Moe(experts=4, top_k=2, expert_width=128, shared_width=128)
    assert (g.attention, g.gdn) == (TINY_ATTENTION, TINY_GDN)


def test_the_official_benchmark_geometries() -> None:
    dense = geometry("qwen3_6_27b")
    assert (dense.model_type, dense.hidden, dense.vocab, dense.layers) == (DENSE, 5120, 248320, 64)
    assert dense.full_attention_interval == 4
    assert dense.attention == Attention(24, 4, 256, 64, 1e7, (11, 11, 10))
    assert dense.gdn == Gdn(16, 128, 48, 128, 4) and dense.gdn.ratio == 3
    assert dense.ffn == DenseMlp(17408)
    moe = geometry("qwen3_6_35b_a3b")
    assert (moe.model_type, moe.hidden, moe.layers) == (MOE, 2048, 40)
    assert moe.full_attention_interval == 4
    assert moe.attention == Attention(16, 2, 256, 64, 1e7, (11, 11, 10))
    assert moe.gdn == Gdn(16, 128, 32, 128, 4)
    assert moe.moe == Moe(experts=256, top_k=8, expert_width=512, shared_width=512)


QWEN3_5_GEOMETRIES = sorted(n for n, c in GEOMETRIES.items() if c["model_type"] in (DENSE, MOE))


@pytest.mark.parametrize("name", QWEN3_5_GEOMETRIES)
def test_the_runtime_and_the_binder_read_the_same_geometry(name: str) -> None:
    config = GEOMETRIES[name]
    g = geometry(name)
    runtime = Qwen35Config.from_text_config(config)
    assert (runtime.hidden, runtime.vocab, runtime.eps) == (g.hidden, g.vocab, g.eps)
    assert runtime.layer_types == g.layer_types
    assert (runtime.attention, runtime.gdn) == (g.attention, g.gdn)
    if g.moe is None:
        assert runtime.moe is None
    else:
        assert runtime.moe is not None and runtime.moe.held == range(g.moe.experts)
        assert (runtime.moe.experts, runtime.moe.top_k) == (g.moe.experts, g.moe.top_k)
    if g.layers > 8:
        return  # the official geometries' name tables are long; the tiny ones suffice
    shapes = {p.name: p.shape for p in expected_parameters(config, components=("text", "mtp"))}
    assert g.gdn is not None and g.attention is not None
    assert shapes["text/layers/0/gdn/convolution"] == (g.gdn.conv_kernel, g.gdn.conv_channels)
    assert shapes["mtp/layers/0/attention/key"] == (g.attention.kv_heads * 64, g.hidden)


# --- defaults and derivations ------------------------------------------------------------------


def test_layer_types_follow_full_attention_interval_when_absent() -> None:
    assert layer_types_for_interval(5, 2) == [L, F, L, F, L]
    config = tiny_config()
    del config["layer_types"]
    config["full_attention_interval"] = 4
    assert Qwen35Geometry.from_config(config).layer_types == (L, L, L, F)
    with pytest.raises(ValueError, match="positive integer"):
        layer_types_for_interval(4, 0)
    config["num_hidden_layers"] = 10**12
    with pytest.raises(
        GeometryError, match="'layer_types' is missing and 1000000000000 layers are too many"
    ):
        Qwen35Geometry.from_config(config)


def test_full_attention_interval_must_agree_with_layer_types() -> None:
    config = tiny_config()
    config["full_attention_interval"] = 2
    assert Qwen35Geometry.from_config(config).layer_types == (L, F, L, F)
    config["full_attention_interval"] = 4
    with pytest.raises(GeometryError) as caught:
        Qwen35Geometry.from_config(config)
    assert caught.value.problems == [
        "text config member 'full_attention_interval' (4) disagrees with layer_types"
        " (layer i is full attention iff (i + 1) % 4 == 0)"
    ]


def test_an_irregular_layer_pattern_has_no_interval() -> None:
    config = tiny_config()
    config["layer_types"] = [L, F, F, L]
    assert Qwen35Geometry.from_config(config).full_attention_interval is None
    config["layer_types"] = [L, L, L, L]
    g = Qwen35Geometry.from_config(config)
    assert g.full_attention_interval is None and g.attention is None  # nothing needs it


def test_the_mtp_block_needs_the_attention_members() -> None:
    config = tiny_config()
    config["layer_types"] = [L, L, L, L]
    assert Qwen35Geometry.from_config(config, with_mtp=True).attention == TINY_ATTENTION
    del config["head_dim"]
    with pytest.raises(GeometryError) as caught:
        Qwen35Geometry.from_config(config, with_mtp=True)
    assert caught.value.problems == [
        "text config member 'head_dim' is missing (the mtp block is a full-attention block)"
    ]


def test_the_variant_comes_from_architectures_without_model_type() -> None:
    config = tiny_moe_config()
    del config["model_type"]
    assert Qwen35Geometry.from_config(config).model_type == MOE
    # the runtime used to take any config without model_type for dense
    assert Qwen35Config.from_text_config(config).moe is not None
    config = tiny_config()
    del config["model_type"], config["architectures"]
    assert Qwen35Geometry.from_config(config).model_type == DENSE


def test_an_f32_rounded_rotary_factor_rotates_a_whole_number_of_pairs() -> None:
    # 80 × f32(0.35) = 27.9999995: truncated it would rotate an odd 27 dims
    config = tiny_config()
    config["head_dim"] = 80
    config["rope_parameters"].update(
        partial_rotary_factor=float(np.float32(0.35)), mrope_section=[6, 4, 4]
    )
    assert Qwen35Geometry.from_config(config).attention.rotary_dim == 28
    runtime = Qwen35Config.from_text_config(config)
    assert runtime.attention is not None and runtime.attention.rotary_dim == 28


# --- one clear error ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            lambda c: c.pop("linear_key_head_dim"),
            "'linear_key_head_dim' is missing (linear_attention layers need it)",
        ),
        (
            lambda c: c.update(linear_num_value_heads=3),
            "'linear_num_value_heads' (3) must be a multiple of linear_num_key_heads (2)",
        ),
        (lambda c: c.update(hidden_size=128.0), "'hidden_size' must be a positive integer"),
        (lambda c: c.update(rms_norm_eps=10**400), "'rms_norm_eps' must be a positive number"),
        (
            lambda c: c.update(model_type="qwen3_5"),
            '\'model_type\' must be "qwen3_5_text" or "qwen3_5_moe_text", got "qwen3_5"',
        ),
        (
            lambda c: c["rope_parameters"].update(partial_rotary_factor=0.5),
            "'rope_parameters.mrope_section' covers 16 rotated dims but head_dim ×"
            " partial_rotary_factor = 32",
        ),
    ],
)
def test_a_bad_member_is_one_error_naming_it(change: Any, problem: str) -> None:
    config = copy.deepcopy(tiny_config())
    change(config)
    with pytest.raises(GeometryError) as caught:
        Qwen35Geometry.from_config(config)
    assert len(caught.value.problems) == 1
    assert caught.value.problems[0].startswith("text config member " + problem)
    assert problem in str(caught.value)
    with pytest.raises(ModelError, match=r"text config cannot define a Qwen3\.5 model") as runtime:
        Qwen35Config.from_text_config(config)
    assert problem in str(runtime.value)


def test_every_bad_member_is_named_at_once() -> None:
    config = tiny_moe_config()
    del config["num_experts"], config["vocab_size"]
    with pytest.raises(GeometryError) as caught:
        Qwen35Geometry.from_config(config)
    assert caught.value.problems == [
        "text config member 'vocab_size' is missing",
        "text config member 'num_experts' is missing",
    ]
