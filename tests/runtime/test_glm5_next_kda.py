"""GLM5Next's KDA layer (``models/glm5_next/kda.py``) against transformers'
``Glm5NextTextLinearAttention`` with the same random weights (float32), and its prompt split
into a prefill, decode steps and a multi-row step against the whole prompt at once."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.models.batch import Batch, DecodeIndex, Lane
from ninfer_runtime.models.glm5_next.config import read_config
from ninfer_runtime.models.glm5_next.kda import KimiDeltaAttention, memory_spec
from ninfer_runtime.state import ContextPool
from tests.runtime.glm5_next_reference import TINY, StandIn, build, hf_text_layers, torch

TOL = 1e-4
T = 45  # past one chunk of the reference's form


@pytest.fixture(scope="module")
def setup():
    model = build(seed=1)
    art = StandIn(model)
    g = read_config(art.components["text"].config)
    layer = KimiDeltaAttention("text/layers/0/", g.kda, g.eps, CpuBackend(), art.weights)
    x = np.random.default_rng(2).standard_normal((T, g.hidden)).astype(np.float32)
    with torch.no_grad():
        ref = hf_text_layers(model)[0].self_attn(torch.from_numpy(x)[None])[0].numpy()
    return g, layer, x, ref


def pool_for(g, rows: int = 1) -> ContextPool:
    return ContextPool([memory_spec(g.kda)], np, slots=2, pages=1, max_context=64, step_rows=rows)


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_a_prompt_matches_transformers(setup) -> None:
    g, layer, x, ref = setup
    pool = pool_for(g)
    state = pool.open(T)
    out = layer(x, Batch((Lane(slice(0, T), 0, state),), None, None), pool.layers[0])
    assert rel(out, ref) < TOL


def test_prefill_then_decode_then_rows_continue_the_prompt(setup) -> None:
    g, layer, x, ref = setup
    pool = pool_for(g, rows=3)
    state = pool.open(T)
    memory, head = pool.layers[0], 40
    outs = [layer(x[:head], Batch((Lane(slice(0, head), 0, state),), None, None), memory)]
    slot = np.array([state.slot], dtype=np.int32)
    for t in (head, head + 1):  # two decode steps
        index = DecodeIndex(slot, np.array([t], np.int32), pool.page_table)
        outs.append(layer(x[t : t + 1], Batch((), None, None, index), memory))
    index = DecodeIndex(np.repeat(slot, 3), np.arange(42, 45, dtype=np.int32), pool.page_table, 3)
    outs.append(layer(x[42:45], Batch((), None, None, index), memory))
    layer.commit(memory, slot, np.array([3], np.int32))
    assert rel(np.concatenate(outs), ref) < TOL
    # the states after all that are the states after the prompt at once
    whole = pool_for(g)
    other = whole.open(T)
    layer(x, Batch((Lane(slice(0, T), 0, other),), None, None), whole.layers[0])
    assert rel(memory.recurrent[state.slot], whole.layers[0].recurrent[other.slot]) < TOL


def test_the_unbounded_forget_gate_is_transformers_softplus_form() -> None:
    model = build(seed=3, text={**TINY, "linear_lower_bound": None})
    art = StandIn(model)
    g = read_config(art.components["text"].config)
    assert g.kda.lower_bound is None
    layer = KimiDeltaAttention("text/layers/0/", g.kda, g.eps, CpuBackend(), art.weights)
    x = np.random.default_rng(4).standard_normal((1, 5, g.hidden)).astype(np.float32)
    gate = hf_text_layers(model)[0].self_attn.forget_gate
    with torch.no_grad():
        ref = gate(torch.from_numpy(x)).numpy()[0]
        f = gate.f_b_proj(gate.f_a_proj(torch.from_numpy(x))).numpy()[0]
    ours = layer.log_decay(f.reshape(5, 3, 4) + layer.dt_bias)
    assert rel(ours, ref) < TOL
