"""What the GLM5Next tests share about transformers' model: how its text parameters become
ninfer's logical ones (names mapped, fused tensors split), and a tiny vision tower (the text
tests only need it to exist)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

#: where the text model's parameters live in ``Glm5NextForConditionalGeneration``'s state dict
TEXT_PREFIX = "model.language_model."
#: a layer parameter's key after ``layers.<i>.`` (``.weight`` dropped) -> its ninfer name
#: under ``text/layers/<i>/``; the fused and shared-name ones are split by each test's mapping
SIMPLE = {
    "input_layernorm": "input_norm",
    "post_attention_layernorm": "post_attention_norm",
    "attn_hc.fn": "mixer_connection/projection",
    "attn_hc.base": "mixer_connection/bias",
    "attn_hc.scale": "mixer_connection/scale",
    "ffn_hc.fn": "ffn_connection/projection",
    "ffn_hc.base": "ffn_connection/bias",
    "ffn_hc.scale": "ffn_connection/scale",
    "self_attn.q_proj": "kda/query",
    "self_attn.k_proj": "kda/key",
    "self_attn.v_proj": "kda/value",
    "self_attn.forget_gate.f_a_proj": "kda/forget_down",
    "self_attn.forget_gate.f_b_proj": "kda/forget_up",
    "self_attn.forget_gate.dt_bias": "kda/dt_bias",
    "self_attn.forget_gate.A_log": "kda/a_log",
    "self_attn.b_proj": "kda/b_projection",
    "self_attn.g_a_proj": "kda/gate_down",
    "self_attn.g_b_proj": "kda/gate_up",
    "self_attn.o_norm": "kda/norm",
    "self_attn.q_a_proj": "mla/query_down",
    "self_attn.q_a_layernorm": "mla/query_norm",
    "self_attn.q_b_proj": "mla/query_up",
    "self_attn.kv_a_proj_with_mqa": "mla/kv_down",
    "self_attn.kv_a_layernorm": "mla/kv_norm",
    "self_attn.indexer.wq_b": "indexer/query",
    "self_attn.indexer.wk": "indexer/key",
    "self_attn.indexer.k_norm": "indexer/key_norm",
    "self_attn.indexer.k_norm.bias": "indexer/key_norm_bias",
    "self_attn.indexer.weights_proj": "indexer/head_weights",
    "self_attn.indexer.index_kpool_compress_gate": "indexer/pool_gate",
    "self_attn.indexer.index_kpool_compress_ape": "indexer/pool_position",
    "mlp.gate_proj": "mlp/gate",
    "mlp.up_proj": "mlp/up",
    "mlp.down_proj": "mlp/down",
    "mlp.gate": "moe/router",
    "mlp.gate.e_score_correction_bias": "moe/router_bias",
    "mlp.shared_experts.gate_proj": "moe/shared/gate",
    "mlp.shared_experts.up_proj": "moe/shared/up",
    "mlp.shared_experts.down_proj": "moe/shared/down",
}
TINY_VISION: dict[str, Any] = dict(
    depth=1, hidden_size=16, num_heads=2, intermediate_size=16, out_hidden_size=32,
    projection_intermediate_size=16,
)  # fmt: skip


def text_parameters(
    name: str, value: np.ndarray, config: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """The ninfer parameters one entry of the text model's state dict becomes (``config``: the
    text config as a dict); fused tensors are split, the convolution laid out [kernel, channels]."""
    if name == "lm_head.weight":
        return {"text/output_head": value}
    key = re.sub(r"\.weight$", "", name.removeprefix(TEXT_PREFIX))
    if key == "embed_tokens":
        return {"text/token_embedding": value}
    if key == "norm":
        return {"text/final_norm": value}
    match = re.fullmatch(r"layers\.(\d+)\.(.+)", key)
    assert match, name
    i, rest = int(match[1]), match[2]
    L = f"text/layers/{i}/"
    if rest == "self_attn.o_proj":  # KDA and MLA both call it o_proj
        block = "kda" if config["layer_types"][i] == "linear_attention" else "mla"
        return {f"{L}{block}/output": value}
    if rest in SIMPLE:
        return {L + SIMPLE[rest]: value}
    if rest == "self_attn.conv1d":  # [3W, 1, K] -> [K, 3W]
        return {L + "kda/convolution": value[:, 0, :].T}
    if rest == "self_attn.kv_b_proj":  # per head [key_h (nope rows) | value_h (v rows)]
        heads, nope = config["num_attention_heads"], config["qk_nope_head_dim"]
        per_head = value.reshape(heads, nope + config["v_head_dim"], -1)
        return {
            L + "mla/key_up": per_head[:, :nope].reshape(-1, value.shape[1]),
            L + "mla/value_up": per_head[:, nope:].reshape(-1, value.shape[1]),
        }
    if rest == "mlp.experts.gate_up_proj":  # [E, 2·I, H]: gate rows, then up rows
        half = value.shape[1] // 2
        return {
            f"{L}moe/experts/{e}/{part}": value[e, rows]
            for e in range(value.shape[0])
            for part, rows in (("gate", slice(None, half)), ("up", slice(half, None)))
        }
    if rest == "mlp.experts.down_proj":  # [E, H, I]
        return {f"{L}moe/experts/{e}/down": value[e] for e in range(value.shape[0])}
    raise AssertionError(f"unmapped parameter {name}")
