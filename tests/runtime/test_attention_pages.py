"""Prefill attention over the paged pool (the attention family's ``prefill``) on the CPU
reference: exactly
``attention`` over the lane's rows gathered token by token and decoded, for every K/V
storage type, shuffled page ids, pages of other lanes (and unwritten rows) holding NaN, and
starts on and off page boundaries. The model's prefill goes through it."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.backends import array_ops
from ninfer_runtime.kv_storage import KV_DTYPES, gather_kv, load_kv, store_kv
from ninfer_runtime.models import load_model
from ninfer_runtime.ops import attention, registry
from ninfer_runtime.ops.attention.memory import KvSpec
from ninfer_runtime.runner import ModelRunner
from ninfer_runtime.state import ContextPool

from .kv_rows import store_rows

PAGE = 4


def pool_with(
    rng: np.random.Generator, kv_dtype: str, nkv: int, d: int, tokens: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(k_pages, v_pages, page ids) of a lane's ``tokens`` random keys/values in shuffled
    pages of a larger pool whose every other row is a stored NaN."""
    dtype = KV_DTYPES[kv_dtype]
    count = -(-tokens // PAGE)
    pages = rng.permutation(count + 3)[:count].astype(np.int32)
    nan = store_kv(np.full(1, np.nan, np.float32), dtype)[0]
    pools = []
    for _ in range(2):
        pool = np.full((count + 3, PAGE, nkv, d), nan, dtype)
        rows = rng.standard_normal((tokens, nkv, d)).astype(np.float32)
        for t in range(tokens):
            pool[pages[t // PAGE], t % PAGE] = store_kv(rows[t], dtype)
        pools.append(pool)
    return pools[0], pools[1], pages


@pytest.mark.parametrize("kv_dtype", list(KV_DTYPES))
@pytest.mark.parametrize(
    ("nq", "nkv", "tokens", "start"),
    [(2, 2, 7, 0), (4, 2, 5, 8), (6, 2, 6, 5), (3, 1, 1, 10)],  # groups 1, 2, 3; mid-page
)
def test_cpu_attention_pages_is_the_gathered_reference(
    kv_dtype: str, nq: int, nkv: int, tokens: int, start: int
) -> None:
    rng = np.random.default_rng(nq * 100 + start)
    d = 8
    k_pages, v_pages, pages = pool_with(rng, kv_dtype, nkv, d, start + tokens)
    q = rng.standard_normal((tokens, nq, d)).astype(np.float32)
    # the rows 0..start+T-1 gathered one token at a time, then decoded
    keys = load_kv(np.stack([k_pages[pages[t // PAGE], t % PAGE] for t in range(start + tokens)]))
    values = load_kv(np.stack([v_pages[pages[t // PAGE], t % PAGE] for t in range(start + tokens)]))
    want = array_ops.attention(q, keys, values, start, 0.35)
    prefill = attention.resolved("prefill", "cpu", k_pages, precision="float32")
    got = prefill(q, k_pages, v_pages, pages, start=start, scale=0.35, precision="float32")
    assert got.dtype == np.float32 and np.isfinite(got).all()
    np.testing.assert_array_equal(got, want)


def test_prefill_lanes_on_the_cpu_is_each_lane_through_its_prefill() -> None:
    """``prefill_lanes`` (several lanes of a packed step at once) on the CPU: lane i's rows of
    q, in row order, through the layer's ``prefill`` with its own start and pages, stacked;
    exactly the lanes read one by one."""
    rng = np.random.default_rng(3)
    nq, nkv, d = 4, 2, 8
    shapes = [(5, 0), (1, 9), (3, 4)]  # (rows, start) of each lane
    lanes, want, queries = [], [], []
    prefill = None
    for t, start in shapes:
        k_pages, v_pages, pages = pool_with(rng, "float32", nkv, d, start + t)
        q = rng.standard_normal((t, nq, d)).astype(np.float32)
        prefill = attention.resolved("prefill", "cpu", k_pages, precision="float32")
        want.append(prefill(q, k_pages, v_pages, pages, start=start, scale=0.35))
        lanes.append((t, start, pages, k_pages, v_pages))
        queries.append(q)
    # one pool for every lane: each lane's pages moved to their own range of it
    k_all = np.concatenate([k for *_, k, _ in lanes])
    v_all = np.concatenate([v for *_, v in lanes])
    offsets = np.cumsum([0] + [k.shape[0] for *_, k, _ in lanes])
    packed = [(t, s, pages + o) for (t, s, pages, _, _), o in zip(lanes, offsets, strict=False)]
    op = attention.resolved("prefill_lanes", "cpu", k_all, precision="float32")
    assert op is registry.providers("attention")["prefill_lanes"]["each"].load()
    got = op(np.concatenate(queries), k_all, v_all, packed, scale=0.35, precision="float32",
             one_lane=prefill)  # fmt: skip
    np.testing.assert_array_equal(got, np.concatenate(want))


def test_varlen_packs_a_steps_lanes_once_for_every_layer(monkeypatch) -> None:
    """``varlen`` derives its key rows and offsets from the step's lanes once: every layer
    of a forward passes the same ``Batch.page_lanes`` tuple and gets the same packing; a new
    step's tuple (even with equal lanes: its pages may have been reused) is packed anew."""
    from ninfer_runtime.models.batch import Batch, Lane
    from ninfer_runtime.ops.attention import varlen

    made = []
    monkeypatch.setattr(
        varlen.Packing, "of", classmethod(lambda cls, lanes, p: made.append(p) or object())
    )
    monkeypatch.setattr(varlen, "_last", None)

    class State:
        page_ids = np.array([3, 1])

    def batch() -> Batch:
        lanes = (Lane(slice(0, 4), 0, State()), Lane(slice(4, 6), 9, State()))
        return Batch(lanes, None, None)

    step = batch()
    assert step.page_lanes is step.page_lanes
    assert [(t, s) for t, s, _ in step.page_lanes] == [(4, 0), (2, 9)]
    first = varlen.packing(step.page_lanes, 16)
    assert all(varlen.packing(step.page_lanes, 16) is first for _ in range(3)) and made == [16]
    assert varlen.packing(batch().page_lanes, 16) is not first and made == [16, 16]
    assert varlen.packing(step.page_lanes, 32) is not first  # another pool's page size


def test_page_ids_are_the_sequences_row_of_the_page_table() -> None:
    """``SequenceState.page_ids`` names the sequence's pages in order, also after it grows,
    and ``gather_kv`` reads what the family's ``write`` stored through them (each row at
    its slot and position, as a prefill chunk stores its rows)."""
    p = ContextPool([KvSpec(2, 8)], np, slots=2, pages=8, max_context=16, page_tokens=PAGE)
    p.open(6)  # so the next sequence's pages are not the first ones
    s = p.open(5)
    assert list(s.page_ids[: len(s.pages)]) == s.pages and s.page_ids.dtype == np.int32
    while s.max_context < 11:
        assert p.grow(s)
    assert list(s.page_ids[: len(s.pages)]) == s.pages and len(s.pages) == 3
    kv = p.layers[0]
    k = np.random.default_rng(1).standard_normal((11, 2, 8)).astype(np.float32)
    store_rows(p, kv, s, 0, k[:5], -k[:5])
    store_rows(p, kv, s, 5, k[5:], -k[5:])
    np.testing.assert_array_equal(gather_kv(kv.k, s.page_ids, 11), k)
    np.testing.assert_array_equal(gather_kv(kv.v, s.page_ids, 11), -k)


def test_prefill_attends_through_the_lanes_pages(artifact_path) -> None:
    """A prefill chunk's attention layers call the family's ``prefill`` with the lane's
    page-table row and the layer's pools as stored (no gathered copy); decode steps do not."""
    model = load_model(artifact_path("qwen3_5_bf16", "dense"))
    calls: list[tuple[int, int, list[int]]] = []
    reference = registry.providers("attention")["prefill"]["reference"].load()

    def spy(q, k_pages, v_pages, pages, *, start, scale, precision):  # type: ignore[no-untyped-def]
        assert k_pages.ndim == 4 and k_pages.dtype == v_pages.dtype == np.uint16
        calls.append((q.shape[0], start, [int(i) for i in pages[:3]]))
        return reference(q, k_pages, v_pages, pages, start=start, scale=scale)

    with registry.patched("attention", "prefill", spy):
        runner = ModelRunner(model)
        pool = runner.new_pool(lanes=2, max_context=64, page_tokens=8, kv_dtype="bfloat16")
        pool.open(9)  # the prefilled sequence's pages come after these
        state = pool.open(40)
        runner.prefill(np.arange(1, 30), state, chunk=12)
        layers = model.config.layer_types.count("full_attention")
        chunks = [(12, 0), (12, 12), (5, 24)]
        assert calls == [(t, s, state.pages[:3]) for t, s in chunks for _ in range(layers)]
        runner.forward([np.array([3])], [state])
        assert len(calls) == len(chunks) * layers


def test_the_reference_reads_its_queries_in_blocks_alike(monkeypatch) -> None:
    """Queries a few at a time (``query_block``), each over the rows it may see: the numbers
    of the whole read, row by row; a query alone attends as it does among the others."""
    from ninfer_runtime import functional

    rng = np.random.default_rng(5)
    t, start, nq, nkv, d = 23, 9, 4, 2, 8
    q = rng.standard_normal((t, nq, d)).astype(np.float32)
    k = rng.standard_normal((start + t, nkv, d)).astype(np.float32)
    v = rng.standard_normal((start + t, nkv, d)).astype(np.float32)
    whole = array_ops.attention(q, k, v, start, 0.3)
    monkeypatch.setattr(functional, "SCORE_BLOCK_BYTES", 2 * 4 * nq * (start + t) * 5)
    calls = []
    causal = array_ops._causal
    monkeypatch.setattr(array_ops, "_causal", lambda q, *a: calls.append(len(q)) or causal(q, *a))
    blocks = array_ops.attention(q, k, v, start, 0.3)  # float32 sums over other lengths
    assert calls == [5, 5, 5, 5, 3]
    np.testing.assert_allclose(blocks, whole, rtol=1e-5, atol=1e-6)
    alone = array_ops.attention(q[17:18], k, v, start + 17, 0.3)
    np.testing.assert_allclose(alone, whole[17:18], rtol=1e-5, atol=1e-6)
