"""QSA attention against transformers' ``Qwen4ExpTextAttention`` and its indexer (fp32):
prompts shorter than the indexer's budget (plain causal attention) and longer (block
selection), as one prefill chunk, as chunks either side of the budget, and as decode steps
over the pages."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.models.batch import Batch, DecodeIndex, Lane
from ninfer_runtime.models.qwen3_5.attention import Rotary
from ninfer_runtime.models.qwen4_exp.memory import IndexedKvSpec
from ninfer_runtime.models.qwen4_exp.qsa import (
    IndexedAttention,
    block_keys,
    chosen_tokens,
    selection,
)
from ninfer_runtime.ops.attention.memory import KvSpec
from ninfer_runtime.state import ContextPool

from .qwen4_exp_modules import array, geometry, randomized, relative_error, tiny_config

LONG = 30  # past the 8-token budget: 7 complete blocks of 4, 2 kept


@pytest.fixture(scope="module")
def case(torch_threads):
    import torch
    from transformers.models.qwen4_exp.modeling_qwen4_exp import (
        Qwen4ExpTextAttention,
        Qwen4ExpTextRotaryEmbedding,
    )

    config = tiny_config()
    config._attn_implementation = "eager"
    g = geometry(config)
    hf = randomized(Qwen4ExpTextAttention(config, layer_idx=1), seed=11)
    x = torch.randn(1, LONG, g.hidden, generator=torch.Generator().manual_seed(12))
    positions = torch.arange(LONG)[None, None].expand(3, 1, LONG)
    cos, sin = Qwen4ExpTextRotaryEmbedding(config)(x, positions)
    a, ix = g.attention, g.indexer
    q_gate = array(hf.q_proj.weight).reshape(a.heads, 2, a.head_dim, g.hidden)
    qk = array(hf.indexer.index_qk_proj.weight)
    weights = {
        "L/attention/query": q_gate[:, 0].reshape(-1, g.hidden),
        "L/attention/gate": q_gate[:, 1].reshape(-1, g.hidden),
        "L/attention/key": array(hf.k_proj.weight),
        "L/attention/value": array(hf.v_proj.weight),
        "L/attention/output": array(hf.o_proj.weight),
        "L/attention/query_norm": array(hf.q_norm.weight),
        "L/attention/key_norm": array(hf.k_norm.weight),
        "L/indexer/query": qk[: ix.heads * ix.head_dim],
        "L/indexer/key": qk[ix.heads * ix.head_dim :],
        "L/indexer/query_norm": array(hf.indexer.q_layernorm.weight),
        "L/indexer/key_norm": array(hf.indexer.k_layernorm.weight),
    }
    be = CpuBackend()
    rotary = Rotary(a, np)
    ours = IndexedAttention("L/", a, ix, g.eps, be, weights)

    def reference(t: int) -> tuple[np.ndarray, np.ndarray]:
        """transformers' output and selection mask for the first t tokens."""
        causal = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None]
        with torch.no_grad():
            out = hf(x[:, :t], (cos[:, :t], sin[:, :t]), causal)[0][0]
            chosen = hf.indexer(x[:, :t], (cos[:, :t], sin[:, :t]), causal, None)[0, 0]
        return array(out), chosen.numpy()

    return g, ours, rotary, array(x[0]), reference


def _pool(g, page_tokens: int = 8):
    a = g.attention
    ix = g.indexer
    spec = IndexedKvSpec(
        KvSpec(a.kv_heads, a.head_dim), ix.head_dim, a.rotary_dim, ix.compress_ratio
    )
    pages = -(-64 // page_tokens)
    return ContextPool([spec], np, slots=1, pages=pages, max_context=64, page_tokens=page_tokens)


@pytest.mark.parametrize("page_tokens", [8, 6])  # whole blocks of 4 a page, or straddling
def test_the_pages_keep_each_complete_blocks_key(case, page_tokens: int) -> None:
    """After a prompt in two chunks (a block split across them) and two decode steps, every
    complete block's key read from the pages is the key made from all the tokens at once;
    and a page's bytes are what its arrays hold."""
    g, ours, rotary, x, _ = case
    t = 23
    pool = _pool(g, page_tokens)
    memory, state = pool.layers[0], pool.open(t + 2)
    for start, end in ((0, 10), (10, t)):
        cos, sin = rotary(np.arange(start, end))
        lane = Lane(slice(0, end - start), start, state)
        ours(x[start:end], Batch((lane,), cos, sin), memory)
    for p in (t, t + 1):
        cos, sin = rotary(np.array([p]))
        step = DecodeIndex(np.array([state.slot], np.int32), np.array([p]), pool.page_table)
        ours(x[p : p + 1], Batch((), cos, sin, step), memory)
    cos, sin = rotary(np.arange(t + 2))
    _, _, _, _, _, ik = ours.project(x[: t + 2], cos, sin)
    ratio = g.indexer.compress_ratio
    want = block_keys(ik, cos, sin, ratio, ours.index_key_norm, g.eps, ours.backend)
    got = memory.blocks.read(state.page_ids, t + 2)
    assert got.shape == want.shape == ((t + 2) // ratio, g.indexer.head_dim)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    held = sum(part.nbytes for part in memory.page_parts())
    assert held == pool.pages * pool.specs[0].page_bytes(page_tokens, "float32")


@pytest.mark.parametrize("t", [6, LONG])
def test_selection_matches_the_indexer(case, t):
    g, ours, rotary, x, reference = case
    _, expected = reference(t)
    cos, sin = rotary(np.arange(t))
    _, _, _, _, iq, ik = ours.project(x[:t], cos, sin)
    ix = g.indexer
    keys = block_keys(ik, cos, sin, ix.compress_ratio, ours.index_key_norm, g.eps, ours.backend)
    chosen = selection(iq, keys, np.arange(t), t, ix)
    assert np.array_equal(chosen, expected)
    assert (chosen.sum(axis=1) <= ix.budget + ix.compress_ratio - 1).all()
    if t > ix.budget:  # selection drops tokens of some queries
        assert (chosen.sum(axis=1) < np.arange(1, t + 1)).any()
    else:
        assert np.array_equal(chosen, np.tril(np.ones((t, t), bool)))


@pytest.mark.parametrize("t", [6, 9, LONG])
def test_chosen_tokens_are_the_selection(case, t):
    """The choice as token ids (what a long context's attention gathers): each query's
    visible ids are exactly the tokens ``selection`` marks, each once."""
    g, ours, rotary, x, _ = case
    cos, sin = rotary(np.arange(t))
    _, _, _, _, iq, ik = ours.project(x[:t], cos, sin)
    ix = g.indexer
    keys = block_keys(ik, cos, sin, ix.compress_ratio, ours.index_key_norm, g.eps, ours.backend)
    ids, visible = chosen_tokens(iq, keys, np.arange(t), ix)
    r = ix.compress_ratio
    assert ids.shape == visible.shape == (t, (min(ix.block_topk, t // r) + 1) * r)
    marked = selection(iq, keys, np.arange(t), t, ix)
    for row in range(t):
        seen = ids[row][visible[row]]
        assert len(set(seen.tolist())) == len(seen)
        assert set(seen.tolist()) == set(np.flatnonzero(marked[row]).tolist()), row


@pytest.mark.parametrize("t", [6, LONG])
def test_prefill_chunk_matches_transformers(case, t):
    g, ours, rotary, x, reference = case
    expected, _ = reference(t)
    pool = _pool(g)
    state = pool.open(t)
    cos, sin = rotary(np.arange(t))
    out = ours(x[:t], Batch((Lane(slice(0, t), 0, state),), cos, sin), pool.layers[0])
    assert relative_error(out, expected) < 1e-4


def test_a_chunk_past_the_budget_reads_its_queries_in_blocks(case, monkeypatch):
    """Queries a few at a time (``query_block``): transformers' output as read whole, and
    the masks, scores and probabilities held at once shrink with the block."""
    import tracemalloc

    from ninfer_runtime import functional

    g, ours, rotary, x, reference = case
    expected, _ = reference(LONG)
    cos, sin = rotary(np.arange(LONG))

    def read() -> tuple[np.ndarray, int]:
        pool = _pool(g)
        batch = Batch((Lane(slice(0, LONG), 0, pool.open(LONG)),), cos, sin)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        out = ours(x[:LONG], batch, pool.layers[0])
        peak = tracemalloc.get_traced_memory()[1] - before
        tracemalloc.stop()
        return out, peak

    read()  # once first: what a first call allocates for good is not the read's
    whole, whole_peak = read()
    monkeypatch.setattr(functional, "SCORE_BLOCK_BYTES", 3 * 4 * LONG * 2 * g.attention.heads)
    blocks, blocks_peak = read()  # three queries a block
    assert relative_error(blocks, expected) < 1e-4
    np.testing.assert_allclose(blocks, whole, rtol=1e-5, atol=1e-6)
    assert blocks_peak < 0.7 * whole_peak


@pytest.mark.parametrize("start", [4, 20])
def test_decode_steps_continue_a_prefill(case, start):
    """From 4: the first steps select every token they see (the plain decode op), the
    later ones past the budget blocks (the indexer's selection); from 20, all past it."""
    g, ours, rotary, x, reference = case
    expected, _ = reference(LONG)
    assert ours.selects_all(start) == (start == 4) and not ours.selects_all(LONG - 1)
    pool = _pool(g)
    state = pool.open(LONG)
    cos, sin = rotary(np.arange(start))
    outs = [ours(x[:start], Batch((Lane(slice(0, start), 0, state),), cos, sin), pool.layers[0])]
    for t in range(start, LONG):
        cos, sin = rotary(np.array([t]))
        step = DecodeIndex(np.array([state.slot], np.int32), np.array([t]), pool.page_table)
        outs.append(ours(x[t : t + 1], Batch((), cos, sin, step), pool.layers[0]))
    assert relative_error(np.concatenate(outs), expected) < 1e-4


@pytest.mark.parametrize("block", [None, 1])  # the step's rows at once, or one at a time
def test_a_step_reads_lanes_of_different_lengths_together(case, monkeypatch, block):
    """Two lanes of different texts, 20 and 10 tokens read, decode in the same steps (rows
    past the budget and within it): each row attends over its own sequence, as it does
    decoding alone (transformers' output for the first text)."""
    from ninfer_runtime import functional

    g, ours, rotary, x, reference = case
    if block is not None:
        monkeypatch.setattr(functional, "SCORE_BLOCK_BYTES", 1)
    texts, starts = (x, x[::-1].copy()), (20, 10)
    a = g.attention
    ix = g.indexer
    spec = IndexedKvSpec(
        KvSpec(a.kv_heads, a.head_dim), ix.head_dim, a.rotary_dim, ix.compress_ratio
    )

    def decode(lanes: list[int]) -> list[list[np.ndarray]]:
        """The given lanes read their starts, then decode together to LONG - starts[0]
        steps; each lane's step outputs."""
        pool = ContextPool([spec], np, slots=2, pages=16, max_context=64, page_tokens=8)
        states = [pool.open(LONG) for _ in lanes]
        for state, lane in zip(states, lanes, strict=True):
            cos, sin = rotary(np.arange(starts[lane]))
            batch = Batch((Lane(slice(0, starts[lane]), 0, state),), cos, sin)
            ours(texts[lane][: starts[lane]], batch, pool.layers[0])
        slots = np.array([state.slot for state in states], np.int32)
        outs: list[list[np.ndarray]] = [[] for _ in lanes]
        for i in range(LONG - starts[0]):
            positions = np.array([starts[lane] + i for lane in lanes])
            cos, sin = rotary(positions)
            step = DecodeIndex(slots, positions.astype(np.int32), pool.page_table)
            rows = np.stack([texts[lane][p] for lane, p in zip(lanes, positions, strict=True)])
            out = ours(rows, Batch((), cos, sin, step), pool.layers[0])
            for r in range(len(lanes)):
                outs[r].append(out[r])
        return outs

    together = decode([0, 1])
    expected, _ = reference(LONG)
    assert relative_error(np.stack(together[0]), expected[starts[0] :]) < 1e-4
    alone = decode([1])[0]
    assert relative_error(np.stack(together[1]), np.stack(alone)) < 1e-5


def test_chunks_either_side_of_the_budget(case):
    """A chunk whose queries all select every token they see takes the plain prefill op;
    the next chunk, past the budget, the selection: together transformers' output."""
    g, ours, rotary, x, reference = case
    expected, _ = reference(LONG)
    pool, split = _pool(g), 10
    assert ours.selects_all(split - 1) and not ours.selects_all(LONG - 1)
    state = pool.open(LONG)
    outs = []
    for a, b in ((0, split), (split, LONG)):
        cos, sin = rotary(np.arange(a, b))
        outs.append(
            ours(x[a:b], Batch((Lane(slice(0, b - a), a, state),), cos, sin), pool.layers[0])
        )
    assert relative_error(np.concatenate(outs), expected) < 1e-4
