"""The context pool: slots and pages handed out and taken back, and the engine admitting
requests by what the pool can hold."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.engine import (
    Engine,
    Finished,
    GenerationRequest,
    TokenEvent,
    parse_capacity,
)
from ninfer_runtime.errors import EngineError, RequestError
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.kv_storage import gather_kv
from ninfer_runtime.ops.attention.memory import AttentionPages, KvSpec
from ninfer_runtime.ops.delta_rule.memory import GdnSpec
from ninfer_runtime.state import ContextPool, PoolFull, SequenceState

from .kv_rows import store_rows
from .test_engine import artifact  # noqa: F401  (module fixture: the bundled model converted)

SPECS = [KvSpec(2, 8), GdnSpec(2, 4, 4, 24, 4)]


def read(kv: AttentionPages, s: SequenceState, length: int) -> tuple[np.ndarray, np.ndarray]:
    """A sequence's first ``length`` keys and values, float32, through its page ids."""
    return gather_kv(kv.k, s.page_ids, length), gather_kv(kv.v, s.page_ids, length)


def pool(slots: int = 2, pages: int = 6, page_tokens: int = 4) -> ContextPool:
    return ContextPool(SPECS, np, slots=slots, pages=pages, max_context=16, page_tokens=page_tokens)


def test_open_reserves_a_slot_and_pages_and_close_returns_them() -> None:
    p = pool()
    a = p.open(10)  # 3 pages of 4 tokens
    assert len(a.pages) == 3 and a.max_context == 10 and a.free == 10
    assert p.free_pages == 3 and p.free_slots == 1
    assert list(p.page_table[a.slot, :3]) == a.pages
    b = p.open(12)
    assert set(a.pages).isdisjoint(b.pages) and a.slot != b.slot
    p.close(a)
    assert p.free_pages == 3 and p.free_slots == 1
    with pytest.raises(EngineError, match="closed"):
        p.close(a)


def test_advance_counts_tokens_read_up_to_the_room_it_has() -> None:
    p = pool()
    a = p.open(10)
    p.advance(a, 7)
    assert a.length == 7 and a.free == 3
    p.advance(a, 3)
    assert a.length == 10 and a.free == 0
    with pytest.raises(EngineError, match="room for 0 more tokens"):
        p.advance(a, 1)


def test_full_pool_is_a_clear_error_and_can_open_says_so() -> None:
    p = pool()
    p.open(16)
    assert not p.can_open(12) and p.can_open(8)
    with pytest.raises(PoolFull, match="need 3 pages, 2 free"):
        p.open(12)
    p.open(4)
    with pytest.raises(PoolFull, match="all 2 slots"):
        p.open(1)
    with pytest.raises(EngineError, match=r"1\.\.16"):
        pool().open(17)


def test_reopened_slot_starts_from_zero_state() -> None:
    p = pool(slots=1)
    a = p.open(8)
    gdn = p.layers[1]
    gdn.recurrent[a.slot] = 1.0
    gdn.conv[a.slot] = 2.0
    p.close(a)
    b = p.open(8)
    assert not gdn.recurrent[b.slot].any() and not gdn.conv[b.slot].any()


def test_attention_pages_round_trip_across_page_boundaries() -> None:
    p = pool(pages=8)
    p.open(5)  # so the next sequence's pages are not 0, 1, 2
    s = p.open(14)
    kv = p.layers[0]
    k = np.random.default_rng(0).standard_normal((14, 2, 8)).astype(np.float32)
    store_rows(p, kv, s, 0, k[:6], -k[:6])
    store_rows(p, kv, s, 6, k[6:], -k[6:])
    keys, values = read(kv, s, 14)
    np.testing.assert_array_equal(keys, k)
    np.testing.assert_array_equal(values, -k)


def test_sizes_add_up() -> None:
    p = pool()
    assert p.page_bytes == 2 * 4 * 2 * 8 * 4
    assert p.slot_bytes == 4 * (2 * 4 * 4 + 24 * 3)
    assert p.nbytes() == 2 * p.slot_bytes + 6 * p.page_bytes


def ask(question: str) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "user", "content": question}],
        sampling=SamplingParams(temperature=0.0, max_tokens=24),
    )


def run_all(engine: Engine, requests: list[GenerationRequest]) -> tuple[dict, int]:
    for r in requests:
        engine.submit(r)
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    most = 0
    while engine.has_work:
        for event in engine.step():
            if isinstance(event, TokenEvent):
                tokens[event.request_id].append(event.token_id)
            assert not isinstance(event, Finished) or event.reason in ("stop", "length")
        most = max(most, engine.lanes_in_use)
        held = sum(len(a.state.pages) for a in engine.scheduler.active.values())
        assert engine.context_usage == held / engine.pool.pages
    assert engine.context_usage == 0.0  # every page back in the pool
    return tokens, most


def test_engine_admits_by_what_the_pool_holds(artifact) -> None:  # noqa: F811
    questions = ["What is the capital of France?", "Hello!", "Name a colour."]
    roomy = Engine(artifact, max_context=256, max_lanes=3)
    expected, most = run_all(roomy, [ask(q) for q in questions])
    assert most == 3

    # room for one request's pages at a time: the others wait, then get the same answers
    one = roomy.pool.slot_bytes * 3 + roomy.pool.page_bytes * 1
    tight = Engine(artifact, max_context=256, max_lanes=3, context_capacity=one)
    assert tight.pool.pages == 1
    requests = [ask(q) for q in questions]
    got, most = run_all(tight, requests)
    assert most == 1
    assert [got[r.request_id] for r in requests] == list(expected.values())
    assert tight.pool.free_pages == 1 and tight.pool.free_slots == 3


def test_prompt_larger_than_the_pool_is_refused(artifact) -> None:  # noqa: F811
    e = Engine(artifact, max_context=1024, max_lanes=1, context_capacity=10**6)
    assert e.pool.pages * e.pool.page_tokens < 1024
    with pytest.raises(RequestError, match="context pool holds") as info:
        e.submit(GenerationRequest(prompt_ids=[5] * 600))
    assert info.value.code == "context_length_exceeded"


def test_for_budget_sizes_pages_from_the_budget_beside_the_recurrent_state() -> None:
    page = ContextPool.page_bytes_of(SPECS, None, 16)
    slot = ContextPool.slot_bytes_of(SPECS)
    every = ContextPool.for_budget(SPECS, np, lanes=3, max_context=100, page_tokens=16)
    assert (every.slots, every.pages, every.max_context) == (3, 3 * 7, 100)
    tight = ContextPool.for_budget(
        SPECS, np, lanes=3, max_context=100, page_tokens=16, budget=3 * slot + 5 * page + 1
    )
    assert (tight.slots, tight.pages) == (3, 5)
    roomy = ContextPool.for_budget(SPECS, np, lanes=3, max_context=100, budget=10**9)
    assert roomy.pages == 3  # never more than every lane at max_context needs


def test_capacity_too_small_for_one_page_is_a_clear_error(artifact) -> None:  # noqa: F811
    engine = Engine(artifact, max_context=64, max_lanes=1)
    with pytest.raises(EngineError, match="holds no K/V page"):
        engine.runner.new_pool(lanes=8, max_context=64, budget=1000)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("auto", "auto"),
        ("1024", 1024),
        ("16G", 16 * 10**9),
        ("24GiB", 24 * 2**30),
        ("512 MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        (None, None),
    ],
)
def test_capacity_sizes(text, value) -> None:
    assert parse_capacity(text) == value


@pytest.mark.parametrize("text", ["lots", "12XB", "-3G", "0"])
def test_bad_capacity_names_the_value(text) -> None:
    with pytest.raises(EngineError, match="context capacity"):
        parse_capacity(text)
    from pydantic import ValidationError

    from ninfer_serve.config import EngineSettings

    with pytest.raises(ValidationError, match="context capacity"):
        EngineSettings(context_capacity=text)


def test_bf16_words_match_the_format_codec() -> None:
    from ninfer_format.numeric import f32_to_bf16
    from ninfer_runtime.kv_storage import from_bf16_words, to_bf16_words

    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    values = np.concatenate(
        [bits.view(np.float32), np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1.00390625])]
    )
    words = to_bf16_words(values)
    assert words.dtype == np.uint16
    np.testing.assert_array_equal(words, f32_to_bf16(values))
    back = from_bf16_words(words)
    np.testing.assert_array_equal(to_bf16_words(back), words)  # exact round trip


def test_bf16_pages_store_rounded_values() -> None:
    from ninfer_runtime.kv_storage import from_bf16_words, to_bf16_words

    p = ContextPool(SPECS, np, slots=1, pages=4, max_context=16, page_tokens=4, kv_dtype="bfloat16")
    assert p.layers[0].k.dtype == np.uint16 and p.page_bytes == 2 * 4 * 2 * 8 * 2
    s = p.open(9)
    k = np.random.default_rng(0).standard_normal((9, 2, 8)).astype(np.float32)
    store_rows(p, p.layers[0], s, 0, k, 2 * k)
    keys, values = read(p.layers[0], s, 9)
    assert keys.dtype == np.float32
    np.testing.assert_array_equal(keys, from_bf16_words(to_bf16_words(k)))
    np.testing.assert_array_equal(values, from_bf16_words(to_bf16_words(2 * k)))
    with pytest.raises(EngineError, match="kv_dtype 'fp8'"):
        ContextPool(SPECS, np, slots=1, pages=1, max_context=4, kv_dtype="fp8")


def test_engine_with_bf16_kv_answers_the_same(artifact) -> None:  # noqa: F811
    exact = Engine(artifact, max_context=256, max_lanes=2)
    half = Engine(artifact, max_context=256, max_lanes=2, kv_dtype="bfloat16")
    assert half.pool.page_bytes * 2 == exact.pool.page_bytes
    requests = [ask("What is the capital of France?"), ask("Hello!")]
    want, _ = run_all(exact, requests)
    requests = [ask("What is the capital of France?"), ask("Hello!")]
    got, _ = run_all(half, requests)
    assert list(got.values()) == list(want.values())


def test_e4m3_bytes_match_the_format_codec() -> None:
    """The pool's encoder (any array module) is ``f32_to_e4m3fn``: every sign, exponent and
    3-bit fraction with the discarded low 20 bits at and around the rounding midpoint, plus
    random patterns. (A one-off run over all 2^32 float32 patterns agreed as well.)"""
    from ninfer_format.numeric import e4m3fn_to_f32, f32_to_e4m3fn
    from ninfer_runtime.kv_storage import from_e4m3_bytes, to_e4m3_bytes

    high = np.arange(1 << 12, dtype=np.uint32) << 20
    low = np.array([0, 1, 0x7FFFF, 0x80000, 0x80001, 0xFFFFF], dtype=np.uint32)
    rng = np.random.default_rng(5)
    random = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    bits = np.concatenate([(high[:, None] | low[None, :]).ravel(), random])
    values = bits.view(np.float32)
    codes = to_e4m3_bytes(values)
    assert codes.dtype == np.uint8 and codes.shape == values.shape
    np.testing.assert_array_equal(codes, f32_to_e4m3fn(values))

    corners = {
        1.0625: 0x38,  # halfway between 1 and 1.125: ties to the even code (1.0)
        1.1875: 0x3A,  # halfway between 1.125 and 1.25: up to the even code (1.25)
        448.0: 0x7E,
        464.0: 0x7E,  # the midpoint towards the NaN code saturates
        1e30: 0x7E,
        np.inf: 0x7E,
        -np.inf: 0xFE,
        2.0**-10: 0x00,  # half the smallest subnormal: ties to 0
        3 * 2.0**-10: 0x02,
        2.0**-6 - 2.0**-12: 0x08,  # rounds up into the smallest normal
        -0.0: 0x80,
        np.nan: 0x7F,
        -np.nan: 0xFF,
    }
    got = to_e4m3_bytes(np.array(list(corners), dtype=np.float32))
    assert [hex(c) for c in got] == [hex(c) for c in corners.values()]

    every = np.arange(256, dtype=np.uint8)
    decoded = from_e4m3_bytes(every)
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded.view(np.uint32), e4m3fn_to_f32(every).view(np.uint32))
    # exact round trip (the decoder's NaN has no sign, so 0xFF comes back as 0x7F)
    np.testing.assert_array_equal(to_e4m3_bytes(decoded)[:255], every[:255])


def test_fp8_pages_store_rounded_values() -> None:
    from ninfer_format.numeric import e4m3fn_to_f32, f32_to_e4m3fn

    p = ContextPool(SPECS, np, slots=1, pages=4, max_context=16, page_tokens=4, kv_dtype="fp8_e4m3")
    assert p.layers[0].k.dtype == np.uint8 and p.page_bytes == 2 * 4 * 2 * 8 * 1
    s = p.open(9)
    k = np.random.default_rng(0).standard_normal((9, 2, 8)).astype(np.float32)
    k[3, 1, :4] = [500.0, -1e4, 3e-3, -1e-4]  # saturated, subnormal, flushed to -0
    store_rows(p, p.layers[0], s, 0, k, 2 * k)
    keys, values = read(p.layers[0], s, 9)
    assert keys.dtype == np.float32
    np.testing.assert_array_equal(keys, e4m3fn_to_f32(f32_to_e4m3fn(k)))
    np.testing.assert_array_equal(values, e4m3fn_to_f32(f32_to_e4m3fn(2 * k)))
    assert keys[3, 1, :2].tolist() == [448.0, -448.0]


@pytest.mark.parametrize(("name", "size"), [("float32", 4), ("bfloat16", 2), ("fp8_e4m3", 1)])
def test_kv_dtypes_are_accepted_everywhere(name: str, size: int) -> None:
    from ninfer_runtime.kv_storage import KV_DTYPES, kv_value_bytes
    from ninfer_serve.config import EngineSettings

    assert kv_value_bytes(name) == KV_DTYPES[name].itemsize == size
    assert EngineSettings(kv_dtype=name).kv_dtype == name
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="kv_dtype 'fp8'"):
        EngineSettings(kv_dtype="fp8")


def test_engine_with_fp8_kv_runs(artifact) -> None:  # noqa: F811
    """A quarter of the float32 K/V bytes. The text is not compared with float32's: 3-bit
    mantissas move this model's logits by up to ~5% of their scale."""
    exact = Engine(artifact, max_context=256, max_lanes=2)
    fp8 = Engine(artifact, max_context=256, max_lanes=2, kv_dtype="fp8_e4m3")
    assert fp8.pool.page_bytes * 4 == exact.pool.page_bytes
    assert {layer.k.dtype for layer in fp8.pool.layers if isinstance(layer, AttentionPages)} == {
        np.dtype(np.uint8)
    }
    got, _ = run_all(fp8, [ask("What is the capital of France?"), ask("Hello!")])
    assert len(got) == 2 and all(got.values())


def test_snapshots_keep_the_states_in_pages_byte_for_byte() -> None:
    """A checkpoint copies the GDN states into pages of its own (here two pages, runs that
    cross the K/V parts of a page and the pages), never touches other pages, and a sequence
    resumed from it gets back exactly the states."""
    specs = [KvSpec(2, 8), GdnSpec(2, 4, 4, 24, 4), KvSpec(1, 8), GdnSpec(2, 4, 4, 24, 4)]
    p = ContextPool(specs, np, slots=2, pages=8, max_context=16, page_tokens=4)
    assert p.snapshot_pages == 2  # 832 bytes of states, 768 bytes a page
    rng = np.random.default_rng(0)
    a = p.open(8)
    gdn = [layer for layer in p.layers if not isinstance(layer, AttentionPages)]
    kv = [layer for layer in p.layers if isinstance(layer, AttentionPages)]
    for layer in gdn:
        layer.recurrent[a.slot] = rng.standard_normal(layer.recurrent[a.slot].shape)
        layer.conv[a.slot] = rng.standard_normal(layer.conv[a.slot].shape)
    for layer in kv:
        layer.k[a.pages] = rng.standard_normal(layer.k[a.pages].shape)
    a.length = 6
    states = [(layer.recurrent[a.slot].copy(), layer.conv[a.slot].copy()) for layer in gdn]
    pages_before = [layer.k[a.pages].copy() for layer in kv]
    kept = p.keep(a)
    assert len(kept.snapshot) == 2 and set(kept.snapshot).isdisjoint(a.pages)
    assert p.free_pages == 8 - 2 - 2 and p.snapshot_pages_used == 2
    assert all(
        np.array_equal(layer.k[a.pages], b) for layer, b in zip(kv, pages_before, strict=True)
    )
    for layer in gdn:  # the lane moves on
        layer.recurrent[a.slot] = 0
        layer.conv[a.slot] = 0
    b = p.open(10, prefix=kept)
    assert b.length == 6
    for layer, (recurrent, conv) in zip(gdn, states, strict=True):
        assert np.array_equal(layer.recurrent[b.slot], recurrent)
        assert np.array_equal(layer.conv[b.slot], conv)
    p.close(a)
    p.close(b)
    p.drop(kept)
    assert p.free_pages == 8 and p.snapshot_pages_used == 0


def test_a_sequence_resumed_in_a_used_slot_gets_every_state_back() -> None:
    """Opening from a checkpoint zeroes nothing first (the snapshot holds every slot state):
    whatever the slot held before, the resumed states are the checkpoint's."""
    p = ContextPool([KvSpec(2, 8), GdnSpec(2, 4, 4, 24, 4)], np, slots=1, pages=8, max_context=16)
    gdn = p.layers[1]
    a = p.open(8)
    rng = np.random.default_rng(1)
    gdn.recurrent[a.slot] = rng.standard_normal(gdn.recurrent[a.slot].shape)
    gdn.conv[a.slot] = rng.standard_normal(gdn.conv[a.slot].shape)
    want = gdn.recurrent[a.slot].copy(), gdn.conv[a.slot].copy()
    a.length = 6
    kept = p.keep(a)
    gdn.recurrent[a.slot], gdn.conv[a.slot] = 7.0, -7.0  # the lane moved on, then ended
    p.close(a)
    b = p.open(10, prefix=kept)  # the one slot again
    assert np.array_equal(gdn.recurrent[b.slot], want[0])
    assert np.array_equal(gdn.conv[b.slot], want[1])
    p.close(b)
    c = p.open(4)
    assert not gdn.recurrent[c.slot].any() and not gdn.conv[c.slot].any()  # fresh: zeroed


def test_a_checkpoint_needs_free_pages_for_its_snapshot() -> None:
    p = pool(slots=1, pages=3)  # 416 bytes of states fit one 512-byte page
    a = p.open(12)  # all three pages
    a.length = 5
    assert p.keep(a) is None
    p.close(a)
    a = p.open(8)
    a.length = 5
    assert p.keep(a) is not None and p.free_pages == 0


def test_a_budget_shares_every_page_when_checkpoints_are_kept() -> None:
    page = ContextPool.page_bytes_of(SPECS, None, 4)
    budget = 2 * ContextPool.slot_bytes_of(SPECS) + 20 * page
    plain = ContextPool.for_budget(SPECS, np, lanes=2, max_context=16, budget=budget, page_tokens=4)
    caching = ContextPool.for_budget(
        SPECS, np, lanes=2, max_context=16, budget=budget, page_tokens=4, snapshots=1
    )
    assert plain.pages == 8  # what two lanes of 16 tokens can use
    assert caching.pages == 20  # the rest goes to checkpoints (their K/V and snapshots)
    unlimited = ContextPool.for_budget(
        SPECS, np, lanes=2, max_context=16, page_tokens=4, snapshots=3
    )
    assert unlimited.pages == 8 + 3
