"""A tiny transformers GLM5Next with random weights, and the same weights under ninfer names,
for the runtime's GLM5Next tests (module by module, and the whole model on a stand-in
artifact until a converted one is used).

Every parameter is drawn afresh (transformers' initialisation leaves gates and biases at
zero or one, where mistakes hide); the forget gate's ``A_log`` and ``dt_bias`` stay small so
the decays are those of a trained model's range.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
glm5 = pytest.importorskip("transformers.models.glm5_next.modeling_glm5_next")
from transformers import Glm5NextConfig  # noqa: E402

from tests.glm5_next_layout import TEXT_PREFIX, TINY_VISION, text_parameters  # noqa: E402

#: both token mixers (KDA layers first, as in the real schedule), both FFN kinds, an attention
#: layer with its own indexer followed by one sharing it; index_topk 8 in pools of 4, so a
#: prompt past 8 + 3 tokens has its attention chosen; 8 indexer heads, so an all-zero
#: (relu'd) pool score, a tie transformers breaks its own way, is rare
TINY: dict[str, Any] = dict(
    vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
    num_hidden_layers=5, num_attention_heads=2, num_key_value_heads=2, n_shared_experts=2,
    n_routed_experts=8, kv_lora_rank=12, q_lora_rank=16, qk_rope_head_dim=0, v_head_dim=6,
    qk_nope_head_dim=10, n_group=2, topk_group=1, num_experts_per_tok=2, index_topk=8,
    index_head_dim=8, index_n_heads=8, index_kpool=4, linear_head_dim=4, linear_num_heads=3,
    linear_conv_kernel_dim=3, hc_mult=3, pad_token_id=0, routed_scaling_factor=2.5,
    swiglu_limit=1.5,
    mlp_layer_types=["dense", "sparse", "sparse", "dense", "sparse"],
    layer_types=["linear_attention", "indexed_attention", "indexed_attention",
                 "linear_attention", "indexed_attention"],
    indexer_types=["full", "full", "shared", "full", "full"],
)  # fmt: skip


def build(seed: int = 0, text: dict[str, Any] | None = None) -> Any:
    """The tiny ``Glm5NextForConditionalGeneration`` (eager attention, float32, eval) with
    every parameter random."""
    torch.manual_seed(seed)
    config = Glm5NextConfig(text_config=text or TINY, vision_config=TINY_VISION)
    config.text_config._attn_implementation = "eager"
    model = glm5.Glm5NextForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                p.copy_(torch.rand_like(p) - 0.5)
            elif name.endswith("scale") and "_hc." in name:
                p.copy_(0.5 + torch.rand_like(p))
            elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.5 if p.dim() == 1 else p.shape[-1] ** -0.5))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    return model


def ninfer_weights(model: Any) -> dict[str, np.ndarray]:
    """The text weights under ninfer's logical names (the binder's contract), float32."""
    c = model.config.text_config
    out: dict[str, np.ndarray] = {}
    for name, tensor in model.state_dict().items():
        if not (name.startswith(TEXT_PREFIX) or name == "lm_head.weight"):
            continue
        value = tensor.detach().float().numpy()
        for logical, array in _logical(name, value, c).items():
            out[logical] = np.ascontiguousarray(array, dtype=np.float32)
    return out


def _logical(name: str, value: np.ndarray, c: Any) -> dict[str, np.ndarray]:
    return text_parameters(name, value, c.to_dict())


class StandIn:
    """What the model reads of an artifact: the text config, the bindings and parameters."""

    def __init__(self, model: Any):
        self.weights = ninfer_weights(model)
        config = model.config.text_config.to_dict()
        self.components = {"text": SimpleNamespace(config=config)}
        self.bindings = set(self.weights)
        self.uses: list[Any] = []

    def parameter(self, name: str, in_order: bool = False) -> np.ndarray:
        return self.weights[name]


def hf_text_layers(model: Any) -> Any:
    return model.model.language_model.layers
