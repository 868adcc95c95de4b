"""GLM5Next's latent attention and token indexer (``models/glm5_next/mla.py``, ``indexer.py``)
against transformers' ``Glm5NextTextAttention`` with the same random weights (float32): a layer
running its own indexer and the ``shared`` layer after it, for prompts within and past
``index_topk``; then a prompt's tail as decode steps against the prompt at once, with pages
of whole pools and pages whose pools straddle them; the pool keys kept in the pages against
keys made from the records at once (after a resumption inside a pool too), and a page's
bytes against what the pages hold."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.models.batch import Batch, DecodeIndex, Lane
from ninfer_runtime.models.glm5_next.config import read_config
from ninfer_runtime.models.glm5_next.mla import LatentAttention, memory_spec
from ninfer_runtime.state import ContextPool
from tests.runtime.glm5_next_reference import StandIn, build, hf_text_layers, torch

TOL = 1e-4


@pytest.fixture(scope="module")
def setup():
    model = build(seed=5)
    art = StandIn(model)
    g = read_config(art.components["text"].config)
    be = CpuBackend()
    full = LatentAttention("text/layers/1/", g.mla, g.indexer, g.eps, be, art.weights)
    shared = LatentAttention("text/layers/2/", g.mla, None, g.eps, be, art.weights)
    return model, g, full, shared


def pool_for(g, context: int, page_tokens: int = 4) -> ContextPool:
    specs = [memory_spec(g.mla, g.indexer), memory_spec(g.mla, None)]
    pages = 2 * -(-context // page_tokens)
    return ContextPool(specs, np, slots=2, pages=pages, max_context=context,
                       page_tokens=page_tokens)  # fmt: skip


def reference(model, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """transformers' two layers on x [T, H]: their outputs and the first's top-k indices."""
    layers = hf_text_layers(model)
    mask = torch.ones(1, x.shape[0], dtype=torch.bool)
    with torch.no_grad():
        out1, _, topk = layers[1].self_attn(torch.from_numpy(x)[None], mask)
        out2, _, _ = layers[2].self_attn(torch.from_numpy(x)[None], mask, prev_topk_indices=topk)
    return out1[0].numpy(), out2[0].numpy(), topk[0].numpy()


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("t", [7, 40])  # within index_topk (everything seen), and past it
def test_a_prompt_matches_transformers(setup, t: int) -> None:
    model, g, full, shared = setup
    x = np.random.default_rng(t).standard_normal((t, g.hidden)).astype(np.float32)
    ref1, ref2, topk = reference(model, x)
    pool = pool_for(g, 64)
    state = pool.open(t)
    batch = Batch((Lane(slice(0, t), 0, state),), None, None)
    out1, chosen = full(x, batch, pool.layers[0], None)
    out2, _ = shared(x, batch, pool.layers[1], chosen)
    # the same tokens are seen as transformers' indices name
    seen = np.zeros((t, t), dtype=bool)
    for row, indices in enumerate(topk):
        seen[row, indices[indices >= 0]] = True
    visible = chosen[0].visible(slice(0, t), t)
    assert np.array_equal(visible, seen)
    if t > g.indexer.topk + g.indexer.kpool:  # some queries see only part of their past
        assert (visible.sum(axis=1) < np.arange(1, t + 1)).any()
    assert rel(out1, ref1) < TOL and rel(out2, ref2) < TOL


@pytest.mark.parametrize("page_tokens", [4, 6])  # the tiny model's pools are 4 tokens
def test_decode_rows_continue_the_prompt(setup, page_tokens: int) -> None:
    model, g, full, shared = setup
    t, head = 30, 22
    x = np.random.default_rng(9).standard_normal((t, g.hidden)).astype(np.float32)
    ref1, ref2, _ = reference(model, x)
    pool = pool_for(g, 32, page_tokens)
    state = pool.open(t)
    batch = Batch((Lane(slice(0, head), 0, state),), None, None)
    out1, chosen = full(x[:head], batch, pool.layers[0], None)
    out2, _ = shared(x[:head], batch, pool.layers[1], chosen)
    outs1, outs2 = [out1], [out2]
    slot = np.array([state.slot], dtype=np.int32)
    for step in range(head, t):
        index = DecodeIndex(slot, np.array([step], np.int32), pool.page_table)
        step_batch = Batch((), None, None, index)
        o1, chosen = full(x[step : step + 1], step_batch, pool.layers[0], None)
        o2, _ = shared(x[step : step + 1], step_batch, pool.layers[1], chosen)
        outs1.append(o1)
        outs2.append(o2)
    assert rel(np.concatenate(outs1), ref1) < TOL and rel(np.concatenate(outs2), ref2) < TOL


@pytest.mark.parametrize("gathered", [True, False])  # chosen tokens gathered, or all masked
@pytest.mark.parametrize("block", [None, 1])  # the step's rows at once, or one at a time
def test_a_step_reads_lanes_of_different_lengths_together(
    setup, monkeypatch, block, gathered: bool
) -> None:
    """Decode steps of two lanes, one past ``index_topk`` and one within it, and then a
    verification-shaped step of two rows of one lane: each row attends over its own
    sequence, as transformers does for that sequence alone, whether it reads the tokens it
    chose gathered (the tiny model's choice, 12 tokens against the 64 a slot holds) or the
    whole bucket under its mask (the prompts' chunks alike)."""
    from ninfer_runtime import functional
    from ninfer_runtime.models.glm5_next import mla

    model, g, full, shared = setup
    if block is not None:  # a block holds one row's scores
        monkeypatch.setattr(functional, "SCORE_BLOCK_BYTES", 1)
    policy, reads = mla.reads_chosen_tokens, []

    def decides(selected: int, tokens: int) -> bool:
        reads.append((tokens, policy(selected, tokens)))
        return gathered

    monkeypatch.setattr(mla, "reads_chosen_tokens", decides)
    lengths, heads = (30, 14), (21, 6)
    xs = [np.random.default_rng(40 + t).standard_normal((t, g.hidden)).astype(np.float32)
          for t in lengths]  # fmt: skip
    refs = [reference(model, x)[:2] for x in xs]
    pool = pool_for(g, 64)
    states = [pool.open(t) for t in lengths]
    got: list[list[list[np.ndarray]]] = [[[], []], [[], []]]
    for i, (x, state, head) in enumerate(zip(xs, states, heads, strict=True)):
        batch = Batch((Lane(slice(0, head), 0, state),), None, None)
        out1, chosen = full(x[:head], batch, pool.layers[0], None)
        out2, _ = shared(x[:head], batch, pool.layers[1], chosen)
        got[i][0].append(out1)
        got[i][1].append(out2)
    at = list(heads)

    def step(rows: list[tuple[int, int]]) -> None:
        """One step of (lane, position) rows."""
        slots = np.array([states[i].slot for i, _ in rows], np.int32)
        index = DecodeIndex(slots, np.array([p for _, p in rows], np.int32), pool.page_table)
        batch = Batch((), None, None, index)
        x = np.concatenate([xs[i][p : p + 1] for i, p in rows])
        out1, chosen = full(x, batch, pool.layers[0], None)
        out2, _ = shared(x, batch, pool.layers[1], chosen)
        for r, (i, _) in enumerate(rows):
            got[i][0].append(out1[r : r + 1])
            got[i][1].append(out2[r : r + 1])

    while at[1] < lengths[1]:  # both lanes, one token each
        step([(0, at[0]), (1, at[1])])
        at = [at[0] + 1, at[1] + 1]
    while at[0] < lengths[0]:  # lane 0's rest, two rows a step
        rows = [(0, p) for p in range(at[0], min(at[0] + 2, lengths[0]))]
        step(rows)
        at[0] += len(rows)
    for (ref1, ref2), (outs1, outs2) in zip(refs, got, strict=True):
        assert rel(np.concatenate(outs1), ref1) < TOL and rel(np.concatenate(outs2), ref2) < TOL
    # left alone, the policy gathers 12 of a step's 64 tokens (its bucket, at most a slot's
    # pages) and of the 21-token prompt, and reads the 6-token prompt whole
    assert {(64, True), (21, True), (6, False)} <= set(reads)


@pytest.mark.parametrize("page_tokens", [4, 6, 7])
def test_the_pages_keep_each_complete_pools_key(setup, page_tokens: int) -> None:
    """After a prompt in two chunks and a decode step, every complete pool's key read from
    the pages is the key made from its tokens' records at once; and a page's bytes are what
    its arrays hold."""
    _, g, full, _ = setup
    kp, t = g.indexer.kpool, 23
    x = np.random.default_rng(3).standard_normal((t + 1, g.hidden)).astype(np.float32)
    pool = pool_for(g, 32, page_tokens)
    memory, state = pool.layers[0], pool.open(t + 1)
    for start, end in ((0, 9), (9, t)):  # a pool split across the chunks
        lane = Lane(slice(0, end - start), start, state)
        full(x[start:end], Batch((lane,), None, None), memory, None)
    index = DecodeIndex(np.array([state.slot], np.int32), np.array([t], np.int32), pool.page_table)
    full(x[t:], Batch((), None, None, index), memory, None)
    tokens = np.arange(t + 1)
    page, row = state.page_ids[tokens // page_tokens], tokens % page_tokens
    records = memory.index[page, row]
    complete = (t + 1) // kp
    want = full.indexer._pool_keys(records[: complete * kp].reshape(complete, kp, -1))
    keys = memory.pools.read(state.page_ids, t + 1)
    assert keys.shape == (complete, g.indexer.head_dim)
    np.testing.assert_array_equal(keys, want)
    spec = memory_spec(g.mla, g.indexer)
    held = sum(part.nbytes for part in memory.page_parts())
    assert held == pool.pages * spec.page_bytes(page_tokens, "float32")


def test_a_sequence_resumed_inside_a_pool_makes_the_pools_key_again(setup) -> None:
    """A prefix cache's resumption inside a pool: B copies A's first 66 tokens (whole pages,
    then the first rows of a page: pool 16, tokens 64..67, holds two of them and A's key)
    and continues with tokens of its own; every complete pool's key of B is then the key
    made from B's records at once, not A's."""
    _, g, full, _ = setup
    kp, shared, t, page_tokens = g.indexer.kpool, 66, 75, 6
    rng = np.random.default_rng(4)
    xa = rng.standard_normal((t, g.hidden)).astype(np.float32)
    xb = np.concatenate([xa[:shared], rng.standard_normal((t - shared, g.hidden))])
    xb = xb.astype(np.float32)
    pool = pool_for(g, 80, page_tokens)
    memory, a, b = pool.layers[0], pool.open(t), pool.open(t)
    full(xa, Batch((Lane(slice(0, t), 0, a),), None, None), memory, None)
    for i in range(-(-shared // page_tokens)):  # what the prefix cache's copy does
        rows = min(page_tokens, shared - i * page_tokens)
        memory.copy_tokens(int(a.page_ids[i]), int(b.page_ids[i]), rows)
    lane = Lane(slice(0, t - shared), shared, b)
    full(xb[shared:], Batch((lane,), None, None), memory, None)
    tokens = np.arange(t)
    records = memory.index[b.page_ids[tokens // page_tokens], tokens % page_tokens]
    complete = t // kp
    want = full.indexer._pool_keys(records[: complete * kp].reshape(complete, kp, -1))
    np.testing.assert_array_equal(memory.pools.read(b.page_ids, t), want)
    assert not np.array_equal(memory.pools.read(a.page_ids, t)[16], want[16])  # A's differs


def test_latent_attention_reads_its_queries_in_blocks_alike(monkeypatch) -> None:
    """The latent op bounds its scores by reading the queries a block at a time
    (``query_block``): the same numbers as all at once, each query seeing only its own."""
    from ninfer_runtime import functional
    from ninfer_runtime.ops.attention import latent_reference as ref

    rng = np.random.default_rng(2)
    t, heads, rank, tokens = 37, 3, 8, 50
    q = rng.standard_normal((t, heads, rank)).astype(np.float32)
    latents = rng.standard_normal((tokens, rank)).astype(np.float32)
    visible = rng.random((t, tokens)) < 0.4
    visible[:, 0] = True
    whole = ref.latent(q, latents, visible, scale=0.3)
    monkeypatch.setattr(functional, "SCORE_BLOCK_BYTES", 5 * 4 * heads * tokens)  # 5 queries
    np.testing.assert_array_equal(ref.latent(q, latents, visible, scale=0.3), whole)
    alone = ref.latent(q[11:12], latents, visible[11:12], scale=0.3)
    np.testing.assert_array_equal(alone, whole[11:12])


def test_a_long_chunk_reads_its_queries_in_blocks_within_the_plan(setup, monkeypatch) -> None:
    """A chunk past ``index_topk``, its queries scored and attended a block at a time
    (``query_block``: blocks of a few queries here): the same output and choice as read
    whole; and what the layer holds at once grows with its rows, not rows × context, and
    stays within what ``--vram-budget`` plans for a latent layer (``latent_attention``)."""
    import tracemalloc

    from ninfer_runtime import functional
    from ninfer_runtime.backends.cuda.workspace import latent_attention

    model, g, full, shared = setup
    config = model.config.text_config.to_dict()

    def run(t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        x = np.random.default_rng(t).standard_normal((t, g.hidden)).astype(np.float32)
        pool = pool_for(g, t)
        batch = Batch((Lane(slice(0, t), 0, pool.open(t)),), None, None)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        out, chosen = full(x, batch, pool.layers[0], None)
        peak = tracemalloc.get_traced_memory()[1] - before
        tracemalloc.stop()
        out2, _ = shared(x, batch, pool.layers[1], chosen)
        return out, out2, chosen[0].pools, peak

    whole = run(300)
    block = 4 * 4 * g.mla.heads * 300  # about four queries' scores
    monkeypatch.setattr(functional, "SCORE_BLOCK_BYTES", block)
    blocks = run(300)
    for a, b in zip(whole[:3], blocks[:3], strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    assert blocks[3] < whole[3]
    longer = run(1200)  # 4x the rows over 4x the context: 16x the scores read whole
    assert longer[3] < 6 * blocks[3]
    for t, peak in ((300, blocks[3]), (1200, longer[3])):
        assert peak <= latent_attention(config, t), (t, peak, latent_attention(config, t))
