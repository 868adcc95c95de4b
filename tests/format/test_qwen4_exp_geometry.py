"""The Qwen4Exp geometry and binder against transformers' own model: the binder's parameters
are exactly a tiny ``Qwen4ExpForCausalLM``'s state dict (names mapped, fused tensors split),
the n-gram vocabularies and hash multipliers are transformers' numbers, and each bad config is
one clear ``GeometryError``."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ninfer_format.binders import registered_model_types
from ninfer_format.binders.qwen4_exp import expected_parameters
from ninfer_format.binders.qwen4_exp_geometry import (
    DEFAULTS,
    INDEXED_ATTENTION,
    LINEAR_ATTENTION,
    GeometryError,
    Qwen4ExpGeometry,
)
from ninfer_format.binders.qwen4_exp_ngram import head_vocab_sizes
from ninfer_format.errors import DirectoryError

torch = pytest.importorskip("torch")
qwen4 = pytest.importorskip("transformers.models.qwen4_exp.modeling_qwen4_exp")
from transformers import Qwen4ExpTextConfig  # noqa: E402

TINY: dict[str, Any] = dict(
    vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
    num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=8, linear_value_head_dim=8, moe_intermediate_size=16,
    shared_expert_intermediate_size=24, num_experts=4, num_experts_per_tok=2, hc_count=2,
    hc_lowrank=8, ngram_vocab_size_base=50, heads_per_ngram=2, ngram_size=3, ple_embed_dim=16,
    indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8,
    indexer_compress_ratio=4, eos_token_id=1,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                     "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1]},
)  # fmt: skip
#: derived from the config by the geometry, not stored as parameters
DERIVED_BUFFERS = ("layer_multipliers", "ngram_heads_vocab_sizes", "ngram_heads_offsets")
SIMPLE = {
    "embed_tokens": "text/token_embedding",
    "hc_norm": "norm",
    "input_mix_weight_down": "down",
    "input_mix_weight_up": "up",
    "block_inject_weight": "inject",
    "linear_attn.dt_bias": "gdn/dt_bias",
    "linear_attn.A_log": "gdn/a_log",
    "linear_attn.norm": "gdn/norm",
    "linear_attn.out_proj": "gdn/output",
    "linear_attn.in_proj_z": "gdn/z",
    "linear_attn.in_proj_b": "gdn/b_projection",
    "linear_attn.in_proj_a": "gdn/a_projection",
    "self_attn.k_proj": "attention/key",
    "self_attn.v_proj": "attention/value",
    "self_attn.o_proj": "attention/output",
    "self_attn.q_norm": "attention/query_norm",
    "self_attn.k_norm": "attention/key_norm",
    "self_attn.indexer.q_layernorm": "indexer/query_norm",
    "self_attn.indexer.k_layernorm": "indexer/key_norm",
    "mlp.gate": "moe/router",
    "mlp.shared_expert_gate": "moe/shared_score",
    "mlp.shared_expert.gate_proj": "moe/shared/gate",
    "mlp.shared_expert.up_proj": "moe/shared/up",
    "mlp.shared_expert.down_proj": "moe/shared/down",
    "ple.ple_embedding.ngram_embedding": "ple/ngram_table",
    "ple.key_proj": "ple/key",
    "ple.value_proj": "ple/value",
    "ple.norm_key": "ple/key_norm",
    "ple.norm_query": "ple/query_norm",
    "ple.norm_conv": "ple/convolution_norm",
}
CONNECTIONS = {
    "attn_hyper_connection": "mixer_connection",
    "mlp_hyper_connection": "ffn_connection",
}


def _hf_to_ninfer(name: str, shape: tuple[int, ...], c: dict[str, Any]) -> dict[str, tuple]:
    """The ninfer parameters one HF state-dict entry becomes (fused tensors split by rows)."""
    key = re.sub(r"\.weight$", "", name.removeprefix("model."))
    if key == "lm_head":
        return {"text/output_head": shape}
    if key.startswith("hyper_connection_mixer."):
        return {"text/final_connection/" + SIMPLE[key.split(".", 1)[1]]: shape}
    if key in SIMPLE:
        return {SIMPLE[key]: shape}
    match = re.fullmatch(r"layers\.(\d+)\.(.+)", key)
    assert match, name
    L, rest = f"text/layers/{match[1]}/", match[2]
    block, _, part = rest.partition(".")
    if block in CONNECTIONS:
        return {f"{L}{CONNECTIONS[block]}/{SIMPLE[part]}": shape}
    if rest in SIMPLE:
        return {L + SIMPLE[rest]: shape}
    rows, cols = shape[0], shape[-1]
    if rest == "self_attn.q_proj":  # per head [query_h | gate_h]
        return {L + "attention/query": (rows // 2, cols), L + "attention/gate": (rows // 2, cols)}
    if rest == "self_attn.indexer.index_qk_proj":
        q = c["indexer_n_heads"] * c["indexer_head_dim"]
        return {L + "indexer/query": (q, cols), L + "indexer/key": (rows - q, cols)}
    if rest == "linear_attn.in_proj_qkv":
        kg = c["linear_num_key_heads"] * c["linear_key_head_dim"]
        split = {"query": (kg, cols), "key": (kg, cols), "value": (rows - 2 * kg, cols)}
        return {f"{L}gdn/{k}": v for k, v in split.items()}
    if rest in ("linear_attn.conv1d", "ple.conv1d"):  # [C, 1, T] -> [T, C]
        return {L + ("gdn/" if rest[0] == "l" else "ple/") + "convolution": (shape[2], shape[0])}
    experts, out = {}, {}
    if rest == "mlp.experts.gate_up_proj":  # [E, 2·Ir, H]
        experts = {"gate": (shape[1] // 2, shape[2]), "up": (shape[1] // 2, shape[2])}
    elif rest == "mlp.experts.down_proj":  # [E, H, Ir]
        experts = {"down": (shape[1], shape[2])}
    for e in range(shape[0]):
        out.update({f"{L}moe/experts/{e}/{k}": v for k, v in experts.items()})
    assert out, name
    return out


def _model(**overrides: Any) -> tuple[Any, dict[str, Any]]:
    torch.manual_seed(0)
    config = Qwen4ExpTextConfig(**{**TINY, **overrides})
    return qwen4.Qwen4ExpForCausalLM(config).eval(), config.to_dict()


@pytest.fixture(scope="module")
def with_ple() -> tuple[Any, dict[str, Any]]:
    return _model(ple_layer_ids=[3, 1, 3])  # transformers sorts and deduplicates


@pytest.mark.parametrize("variant", ["ple", "no_ple_tied"])
def test_binder_parameters_are_the_state_dict(variant: str, with_ple: tuple) -> None:
    model, config = with_ple if variant == "ple" else _model(tie_word_embeddings=True)
    mapped: dict[str, tuple] = {}
    for name, tensor in model.state_dict().items():
        if name.rsplit(".", 1)[-1] in DERIVED_BUFFERS:
            continue
        for logical, shape in _hf_to_ninfer(name, tuple(tensor.shape), config).items():
            assert logical not in mapped, logical
            mapped[logical] = shape
    expected = {spec.name: spec.shape for spec in expected_parameters(config)}
    assert expected == mapped
    assert any("/ple/" in n for n in expected) is (variant == "ple")


def test_ngram_tables_and_hashes_are_transformers(with_ple: tuple) -> None:
    model, config = with_ple
    g = Qwen4ExpGeometry.from_config(config)
    assert g.ple is not None and g.ple.layers == (0, 2)
    for layer in g.ple.layers:
        hf = model.model.layers[layer].ple.ple_embedding
        assert g.ple.head_vocab_sizes(layer) == tuple(hf.ngram_heads_vocab_sizes.tolist())
        assert g.ple.head_offsets(layer) == tuple(hf.ngram_heads_offsets.tolist())
        assert g.ple.multipliers(layer) == tuple(hf.layer_multipliers.tolist())
        assert g.ple.table_rows(layer) == hf.ngram_embedding.weight.shape[0]
    # the full-size derivation: transformers' own n-th prime search, per global head index
    for base, heads, index in ((20_000_000, 16, 0), (20_000_000, 16, 3), (2, 5, 1), (1, 3, 0)):
        wanted = [
            qwen4._find_nth_prime_after(base - 1, index * heads + h + 1) for h in range(heads)
        ]
        assert list(head_vocab_sizes(base, heads, index)) == wanted


def test_defaults_and_derivations_are_transformers() -> None:
    defaults = Qwen4ExpTextConfig()
    assert {k: getattr(defaults, k) for k in DEFAULTS} == dict(DEFAULTS)
    # transformers' defaults stand in for the Qwen4Exp members (and the layer types) a config omits
    omitted = ("rope_parameters", "hc_count", "hc_lowrank", "ngram_size", "heads_per_ngram",
               "ngram_vocab_size_base", "ple_embed_dim")  # fmt: skip
    config = {k: v for k, v in TINY.items() if k not in omitted}
    config |= dict(max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
                   num_hidden_layers=8, hidden_size=128, linear_conv_kernel_dim=4,
                   rope_parameters={"rope_theta": 1e4}, ple_layer_ids=[1])  # fmt: skip
    g = Qwen4ExpGeometry.from_config(config)
    hf = Qwen4ExpTextConfig(**config)
    assert list(g.layer_types) == hf.layer_types  # derived from full_attention_interval 4
    assert g.layer_types[3] == INDEXED_ATTENTION and g.layer_types[0] == LINEAR_ATTENTION
    assert (g.hyper.streams, g.hyper.rank) == (hf.hc_count, hf.hc_lowrank)
    assert g.attention is not None and g.attention.rotary_dim == 16  # partial factor 1.0
    assert g.attention.mrope_section == (11, 11, 10)
    assert g.ple is not None and g.ple.heads == 16 and g.ple.vocab_base == 20_000_000
    assert g.ple.embed_dim == hf.ple_embed_dim == 128
    full = dict(config, layer_types=["linear_attention"] * 3 + ["full_attention"] * 5)
    assert Qwen4ExpGeometry.from_config(full).layer_types[3:] == (INDEXED_ATTENTION,) * 5
    assert {"qwen4_exp", "qwen4_exp_text"} <= set(registered_model_types())


def _good_config() -> dict[str, Any]:
    """TINY as transformers saves it: every member spelled out."""
    config = Qwen4ExpTextConfig(**TINY).to_dict()
    Qwen4ExpGeometry.from_config(config)  # the baseline itself is good
    return config


BAD = [
    ({"ple_layer_ids": [4]}, "ple_layer_ids' names non-linear_attention layers [4]"),
    ({"ple_layer_ids": [0, 5]}, "ple_layer_ids' must be one-indexed layers 1..4"),
    ({"ple_layer_ids": [1], "eos_token_id": None}, "eos_token_id' must be a token id"),
    ({"ple_layer_ids": [1], "ple_embed_dim": 18}, "ple_embed_dim' (18) must be a multiple"),
    ({"ple_layer_ids": [1], "ngram_size": 1}, "ngram_size' must be at least 2"),
    ({"hc_lowrank": 65}, "hc_lowrank' (65) exceeds hc_count × hidden_size (64)"),
    ({"hc_count": 1}, "hc_count' must be at least 2"),
    ({"indexer_budget": 2}, "indexer_budget' (2) must be a multiple of indexer_compress_ratio"),
    ({"indexer_kv_heads": 2}, "indexer_kv_heads' must be 1"),
    ({"indexer_head_dim": 4}, "indexer_head_dim' (4) is narrower than the attention's rotary"),
    ({"indexer_n_heads": None}, "indexer_n_heads' must be a positive integer"),
    ({"output_gate_type": "gelu"}, "output_gate_type' must name the GDN output gate"),
    ({"attention_bias": True}, "attention_bias' must be false"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok' (5) exceeds num_experts (4)"),
    ({"layer_types": ["linear_attention"] * 3 + ["sliding"]}, "layer_types[3]' must be"),
]


@pytest.mark.parametrize(("change", "line"), BAD, ids=[b[1].split("'")[0] for b in BAD])
def test_a_bad_config_is_one_clear_error(change: dict[str, Any], line: str) -> None:
    config = _good_config() | change
    with pytest.raises(GeometryError) as caught:
        Qwen4ExpGeometry.from_config(config)
    assert len(caught.value.problems) == 1, caught.value.problems
    assert line in caught.value.problems[0]


def test_every_bad_member_is_named_at_once() -> None:
    config = _good_config() | {
        "hc_count": 1,
        "indexer_kv_heads": 3,
        "ple_layer_ids": [4],
        "hidden_size": -1,
    }
    with pytest.raises(GeometryError) as caught:
        Qwen4ExpGeometry.from_config(config)
    named = " ".join(caught.value.problems)
    for member in ("hc_count", "indexer_kv_heads", "ple_layer_ids", "hidden_size"):
        assert f"'{member}'" in named
    assert "Qwen4Exp geometry" in str(caught.value)


def test_the_vision_contract_is_qwen3_5s_tower(with_ple: tuple) -> None:
    """A multimodal artifact's vision component: Qwen3.5's ``vision/`` names, whose shapes
    hold exactly the values of transformers' ``Qwen4ExpVisionModel`` (its fused ``attn.qkv``
    weight and bias each become three parameters)."""
    from transformers import Qwen4ExpVisionConfig

    _, config = with_ple
    vision = Qwen4ExpVisionConfig(
        depth=2, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=4,
        num_position_embeddings=16, out_hidden_size=config["hidden_size"],
    )  # fmt: skip
    vc = vision.to_dict()
    specs = expected_parameters(config, components=("text", "vision"), vision_config=vc)
    ours = [s for s in specs if s.name.startswith("vision/")]
    theirs = qwen4.Qwen4ExpVisionModel(vision).state_dict()
    assert len(ours) == len(theirs) + 4 * vision.depth
    assert sum(s.elements for s in ours) == sum(t.numel() for t in theirs.values())
    assert [s for s in specs if not s.name.startswith("vision/")] == expected_parameters(config)
    with pytest.raises(DirectoryError, match="vision config cannot define"):
        expected_parameters(config, components=("text", "vision"))
