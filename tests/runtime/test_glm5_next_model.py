"""The whole GLM5Next model (``models/glm5_next``) through the runner on the CPU backend,
against transformers' ``Glm5NextForConditionalGeneration`` with the same random weights
(float32): prompt logits within and past ``index_topk`` (in one chunk and in several), then
decode steps and multi-row steps continuing a prompt; and the blocks around the mixers (the
hyper-connection, the clamped MLP, the grouped MoE) against their transformers submodules."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.errors import ModelError
from ninfer_runtime.models.glm5_next import Glm5NextModel, load_glm5_next
from ninfer_runtime.models.glm5_next.ffn import ClampedMlp, GroupedMoe
from ninfer_runtime.models.glm5_next.hyper_connections import HyperConnection
from ninfer_runtime.runner import ModelRunner
from tests.runtime.glm5_next_reference import StandIn, build, hf_text_layers, torch

TOL = 1e-4


@pytest.fixture(scope="module")
def pair():
    model = build(seed=11)
    art = StandIn(model)
    return model, art, Glm5NextModel(art, CpuBackend())


def rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - b).max() / np.abs(b).max())


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids)[None].long()).logits[0].numpy()


@pytest.mark.parametrize(("t", "chunk"), [(9, 512), (41, 512), (41, 16)])
def test_prompt_logits_match_transformers(pair, t: int, chunk: int) -> None:
    model, _, ours = pair
    ids = np.random.default_rng(t).integers(1, ours.config.vocab, t)
    runner = ModelRunner(ours)
    out = runner.prefill(ids, runner.new_state(64), chunk=chunk)
    ref = hf_logits(model, ids)
    if chunk >= t:
        assert rel(out.logits[0], ref) < TOL
    else:  # earlier chunks give only their last row: compare the last chunk's rows
        assert rel(out.logits[0], ref[-(t % chunk or chunk) :]) < TOL


def test_decode_and_multi_row_steps_continue_a_prompt(pair) -> None:
    model, _, ours = pair
    ids = np.random.default_rng(3).integers(1, ours.config.vocab, 30)
    ref = hf_logits(model, ids)
    runner = ModelRunner(ours)
    pool = runner.new_pool(lanes=2, max_context=32, page_tokens=4, step_rows=3)
    state, other = pool.open(32), pool.open(32)
    runner.prefill(ids[:20], state)
    runner.prefill(ids[:5], other)  # a second lane that decodes alongside
    rows = []
    for t in range(20, 24):
        out = runner.forward([ids[t : t + 1], ids[5 + t - 20 : 6 + t - 20]], [state, other])
        rows.append(out.logits[0])
    for t in range(24, 30, 3):  # three rows a lane as one step (recorded, then folded in)
        out = runner.forward([ids[t : t + 3], ids[t - 15 : t - 12]], [state, other])
        rows.append(out.logits[0])
    assert rel(np.concatenate(rows), ref[20:]) < TOL
    assert rel(out.logits[1], ref[12:15]) < TOL


def test_hyper_connection_mlp_and_moe_match_transformers(pair) -> None:
    model, art, ours = pair
    g, be = ours.config, CpuBackend()
    layer = hf_text_layers(model)[1]  # a sparse layer
    rng = np.random.default_rng(5)
    streams = rng.standard_normal((7, g.hyper.streams, g.hidden)).astype(np.float32)
    connection = HyperConnection("text/layers/1/mixer_connection/", g.hyper, g.eps, be,
                                 art.weights)  # fmt: skip
    x, post, comb = connection(streams)
    with torch.no_grad():
        ref_post, ref_comb, ref_x = layer.attn_hc(torch.from_numpy(streams)[None])
    assert rel(x, ref_x[0].numpy()) < TOL and rel(post, ref_post[0].numpy()) < TOL
    assert rel(comb, ref_comb[0].numpy()) < TOL
    assert np.allclose(comb.sum(axis=1), 1, atol=1e-3)  # Sinkhorn: columns sum to one

    h = 3 * rng.standard_normal((7, g.hidden)).astype(np.float32)  # some past the clamp
    moe = GroupedMoe("text/layers/1/", g.moe, g.routing, g.swiglu_limit, be, art.weights)
    mlp = ClampedMlp("text/layers/0/mlp/", g.swiglu_limit, be, art.weights)
    with torch.no_grad():
        ref_moe = layer.mlp(torch.from_numpy(h)[None])[0].numpy()
        ref_mlp = hf_text_layers(model)[0].mlp(torch.from_numpy(h)).numpy()
        _, ref_weights, ref_top = layer.mlp.gate(torch.from_numpy(h))
    top, weights = moe.route(h)
    order = np.argsort(top, axis=-1)
    ref_order = np.argsort(ref_top.numpy(), axis=-1)
    assert np.array_equal(np.sort(top, axis=-1), np.sort(ref_top.numpy(), axis=-1))
    assert rel(np.take_along_axis(weights, order, -1),
               np.take_along_axis(ref_weights.numpy(), ref_order, -1)) < TOL  # fmt: skip
    assert rel(moe(h), ref_moe) < TOL and rel(mlp(h), ref_mlp) < TOL


def test_only_the_cpu_backend_and_one_rank_run_it(pair) -> None:
    _, art, _ = pair

    class Elsewhere(CpuBackend):
        name = "elsewhere"

    with pytest.raises(ModelError, match="cpu and cuda backend only"):
        load_glm5_next(art, Elsewhere())


def test_latents_stored_in_bf16_stay_close(pair) -> None:
    """A bfloat16 pool keeps the latents in bf16 words (the indexer records in float32)."""
    _, _, ours = pair
    ids = np.random.default_rng(8).integers(1, ours.config.vocab, 20)
    runner = ModelRunner(ours)
    logits = {}
    for kv_dtype in ("float32", "bfloat16"):
        pool = runner.new_pool(lanes=1, max_context=32, page_tokens=8, kv_dtype=kv_dtype)
        logits[kv_dtype] = runner.prefill(ids, pool.open(20)).logits[0]
        latent = pool.layers[1]
        assert latent.latent.dtype == (np.uint16 if kv_dtype == "bfloat16" else np.float32)
        assert latent.index.dtype == np.float32
    error = rel(logits["bfloat16"], logits["float32"])
    assert 0 < error < 3e-2
