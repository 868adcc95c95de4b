"""Hyper-connections against transformers' ``Qwen4ExpTextGatedResidual`` (fp32)."""

from __future__ import annotations

import numpy as np

from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.models.qwen4_exp.hyper_connections import HyperConnection, expand

from .qwen4_exp_modules import array, geometry, randomized, relative_error, tiny_config


def _weights(hf, prefix: str) -> dict[str, np.ndarray]:
    w = {
        prefix + "norm": array(hf.hc_norm.weight),
        prefix + "down": array(hf.input_mix_weight_down.weight),
        prefix + "up": array(hf.input_mix_weight_up.weight),
    }
    if hf.block_inject_weight is not None:
        w[prefix + "inject"] = array(hf.block_inject_weight.weight)
    return w


def test_connection_and_inject_match_transformers(torch_threads):
    import torch
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextGatedResidual

    config = tiny_config()
    g = geometry(config)
    hf = randomized(Qwen4ExpTextGatedResidual(config), seed=1)
    ours = HyperConnection("c/", g.hyper, g.eps, CpuBackend(), _weights(hf, "c/"), with_inject=True)
    streams = torch.randn(7, g.streams_width, generator=torch.Generator().manual_seed(2))
    block_out = torch.randn(7, g.hidden, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        mixed, _, weights = hf(streams)
        expected = streams + (block_out[:, None, :] * weights[:, :, None]).flatten(-2)

    x, logits = ours(array(streams))
    assert relative_error(x, array(mixed)) < 1e-5
    inject_weights = 2 / (1 + np.exp(-logits / g.hyper.streams))
    assert relative_error(inject_weights, array(weights)) < 1e-5
    after = ours.inject(array(streams), array(block_out), logits)
    assert relative_error(after, array(expected)) < 1e-5


def test_final_connection_has_no_inject(torch_threads):
    import torch
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextGatedResidual

    config = tiny_config()
    g = geometry(config)
    hf = randomized(Qwen4ExpTextGatedResidual(config, use_combine=False), seed=4)
    ours = HyperConnection(
        "f/", g.hyper, g.eps, CpuBackend(), _weights(hf, "f/"), with_inject=False
    )
    embedding = torch.randn(5, g.hidden, generator=torch.Generator().manual_seed(5))
    streams = embedding.repeat(1, g.hyper.streams)  # what the text model starts from
    assert np.array_equal(expand(array(embedding), g.hyper.streams), array(streams))
    with torch.no_grad():
        mixed = hf(streams)
    x, w = ours(array(streams))
    assert w is None
    assert relative_error(x, array(mixed)) < 1e-5
