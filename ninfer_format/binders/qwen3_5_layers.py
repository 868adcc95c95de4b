"""Qwen3.5 text parameter tables (spec 5.2): the globals and one generator per block type.

Written in the order of the spec's tables so they can be read side by side with them; other
binders (Qwen4Exp, GLM5Next) build their layers from the same blocks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from .parameter_spec import ParamSpec, Role, _fp32_vector, _matrix, _vector
from .qwen3_5_geometry import FULL_ATTENTION, Attention, DenseMlp, Gdn, Moe
from .qwen3_5_geometry import Qwen35Geometry as Geometry


def _text_globals(g: Geometry, drafters: Sequence[str]) -> Iterator[ParamSpec]:
    head_inputs = ("text/final_hidden", *(f"{d}/final_hidden" for d in drafters))
    yield _matrix("text/token_embedding", g.vocab, g.hidden)  # gathered, never multiplied
    yield _matrix("text/output_head", g.vocab, g.hidden, *head_inputs)
    yield _vector("text/final_norm", g.hidden)


def _attention_block(L: str, a: Attention, hidden: int) -> Iterator[ParamSpec]:
    q, kv, x = a.heads * a.head_dim, a.kv_heads * a.head_dim, L + "mixer_input"
    yield _matrix(L + "attention/query", q, hidden, x)
    yield _matrix(L + "attention/gate", q, hidden, x)
    yield _matrix(L + "attention/key", kv, hidden, x)
    yield _matrix(L + "attention/value", kv, hidden, x)
    yield _vector(L + "attention/query_norm", a.head_dim)
    yield _vector(L + "attention/key_norm", a.head_dim)
    yield _matrix(L + "attention/output", hidden, q, L + "attention/gated_output")


def _gdn_block(L: str, n: Gdn, hidden: int) -> Iterator[ParamSpec]:
    kg, vg, x = n.key_width, n.value_width, L + "mixer_input"
    yield _fp32_vector(L + "gdn/a_log", n.value_heads)
    yield _fp32_vector(L + "gdn/dt_bias", n.value_heads)
    yield ParamSpec(L + "gdn/convolution", (n.conv_kernel, 2 * kg + vg), Role.CONVOLUTION)
    yield _matrix(L + "gdn/a_projection", n.value_heads, hidden, x)
    yield _matrix(L + "gdn/b_projection", n.value_heads, hidden, x)
    yield _matrix(L + "gdn/query", kg, hidden, x)
    yield _matrix(L + "gdn/key", kg, hidden, x)
    yield _matrix(L + "gdn/value", vg, hidden, x)
    yield _matrix(L + "gdn/z", vg, hidden, x)
    yield _vector(L + "gdn/norm", n.value_dim)
    yield _matrix(L + "gdn/output", hidden, vg, L + "gdn/gated_output")


def _dense_mlp(L: str, m: DenseMlp, hidden: int) -> Iterator[ParamSpec]:
    x = L + "ffn_input"
    yield _matrix(L + "mlp/gate", m.intermediate, hidden, x)
    yield _matrix(L + "mlp/up", m.intermediate, hidden, x)
    yield _matrix(L + "mlp/down", hidden, m.intermediate, L + "mlp/product")


def _moe(L: str, m: Moe, hidden: int) -> Iterator[ParamSpec]:
    x = L + "ffn_input"
    yield _matrix(L + "moe/router", m.experts, hidden, x)
    yield _matrix(L + "moe/shared_score", 1, hidden, x)
    yield from _experts(L, m, hidden)


def _experts(L: str, m: Moe, hidden: int) -> Iterator[ParamSpec]:
    """The routed experts, then the shared expert (GLM5Next's MoE has them too)."""
    x = L + "ffn_input"
    for e in range(m.experts):
        expert = f"{L}moe/experts/{e}/"
        yield _matrix(expert + "gate", m.expert_width, hidden, x)
        yield _matrix(expert + "up", m.expert_width, hidden, x)
        yield _matrix(expert + "down", hidden, m.expert_width, expert + "product")
    yield _matrix(L + "moe/shared/gate", m.shared_width, hidden, x)
    yield _matrix(L + "moe/shared/up", m.shared_width, hidden, x)
    yield _matrix(L + "moe/shared/down", hidden, m.shared_width, L + "moe/shared/product")


def _decoder_layer(L: str, layer_type: str, g: Geometry) -> Iterator[ParamSpec]:
    yield _vector(L + "input_norm", g.hidden)
    yield _vector(L + "post_attention_norm", g.hidden)
    if layer_type == FULL_ATTENTION:
        assert g.attention is not None  # the config reader requires it for such layers
        yield from _attention_block(L, g.attention, g.hidden)
    else:
        assert g.gdn is not None
        yield from _gdn_block(L, g.gdn, g.hidden)
    if isinstance(g.ffn, Moe):
        yield from _moe(L, g.ffn, g.hidden)
    else:
        yield from _dense_mlp(L, g.ffn, g.hidden)
