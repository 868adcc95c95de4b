"""Qwen4Exp's MoE block (top-k routed experts renormalised, plus a sigmoid-gated shared
expert) is Qwen3.5's: the runtime's ``SparseMoe`` against transformers'
``Qwen4ExpTextSparseMoeBlock`` (fp32)."""

from __future__ import annotations

from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.models.qwen3_5.mlp import SparseMoe
from ninfer_runtime.models.qwen4_exp.config import moe_config

from .qwen4_exp_modules import array, geometry, randomized, relative_error, tiny_config


def test_moe_with_gated_shared_expert_matches_transformers(torch_threads):
    import torch
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextSparseMoeBlock

    config = tiny_config()
    g = geometry(config)
    hf = randomized(Qwen4ExpTextSparseMoeBlock(config), seed=21)
    width = g.moe.expert_width
    weights = {
        "L/moe/router": array(hf.gate.weight),
        "L/moe/shared_score": array(hf.shared_expert_gate.weight),
        "L/moe/shared/gate": array(hf.shared_expert.gate_proj.weight),
        "L/moe/shared/up": array(hf.shared_expert.up_proj.weight),
        "L/moe/shared/down": array(hf.shared_expert.down_proj.weight),
    }
    for e in range(g.moe.experts):
        gate_up = array(hf.experts.gate_up_proj[e])
        weights[f"L/moe/experts/{e}/gate"] = gate_up[:width]
        weights[f"L/moe/experts/{e}/up"] = gate_up[width:]
        weights[f"L/moe/experts/{e}/down"] = array(hf.experts.down_proj[e])
    moe = SparseMoe("L/", moe_config(g), CpuBackend(), weights)
    x = torch.randn(1, 9, g.hidden, generator=torch.Generator().manual_seed(22))
    with torch.no_grad():
        expected = hf(x)[0]
    assert relative_error(moe(array(x[0])), array(expected)) < 1e-5
