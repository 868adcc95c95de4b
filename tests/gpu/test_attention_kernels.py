"""Paged decode attention and the KV write against ``array_ops`` run in numpy.

Page tables are shuffled, lanes sit at awkward positions (0, 1, a page's last row, the next
page's first, thousands of tokens, the table's last token), and bf16 pools are compared with
the oracle run on the same bf16-rounded values, so both dtypes get the same tight tolerance.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_format.numeric import bf16_to_f32, f32_to_bf16
from ninfer_runtime.backends import array_ops
from ninfer_runtime.backends.cuda import attention

from .conftest import requires_gpu

pytestmark = requires_gpu

#: lane positions, taken in order (PAGE = 16 in most cases)
POSITIONS = [3100, 0, 1, 15, 16, 700, 4095, 2047]


def make_pool(
    rng: np.random.Generator, n: int, nkv: int, d: int, page: int, max_pages: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """K, V pools (float32) for n + 1 slots with shuffled page ids, the table, and the lanes'
    slots (distinct, out of order)."""
    slots_total = n + 1
    pages = slots_total * max_pages
    k = rng.standard_normal((pages, page, nkv, d)).astype(np.float32)
    v = rng.standard_normal((pages, page, nkv, d)).astype(np.float32)
    table = rng.permutation(pages).astype(np.int32).reshape(slots_total, max_pages)
    slots = rng.permutation(slots_total)[:n].astype(np.int32)
    return k, v, table, slots


def used_rows(table: np.ndarray, slots: np.ndarray, positions: np.ndarray, page: int) -> Any:
    """Mask [pages, PAGE]: the pool rows some lane attends to."""
    mask = np.zeros((table.size, page), dtype=bool)
    for s, pos in zip(slots, positions, strict=True):
        t = np.arange(min(pos, table.shape[1] * page - 1) + 1)
        mask[table[s, t // page], t % page] = True
    return mask


def run_case(
    d: int,
    nq: int,
    nkv: int,
    n: int,
    *,
    bf16: bool,
    page: int = 16,
    max_pages: int = 256,
    positions: list[int] | None = None,
    garbage: bool = False,
    seed: int = 0,
) -> None:
    import cupy as cp

    rng = np.random.default_rng(seed)
    k, v, table, slots = make_pool(rng, n, nkv, d, page, max_pages)
    pos = np.array((positions or POSITIONS)[:n], dtype=np.int32)
    q = rng.standard_normal((n, nq, d)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    if bf16:
        k_dev, v_dev = f32_to_bf16(k), f32_to_bf16(v)
        k, v = bf16_to_f32(k_dev), bf16_to_f32(v_dev)  # what the kernel sees
    else:
        k_dev, v_dev = k.copy(), v.copy()
    if garbage:  # rows nobody attends to: NaN and huge values the kernel must never touch
        unused = ~used_rows(table, slots, pos, page)
        k[unused] = 0.0
        v[unused] = 0.0
        bad = np.where(rng.random(unused.sum()) < 0.5, np.nan, 3e38).astype(np.float32)
        bad = f32_to_bf16(bad) if bf16 else bad
        k_dev[unused] = bad[:, None, None]
        v_dev[unused] = bad[:, None, None]
    want = array_ops.attention_decode(q, k, v, table, slots, pos, scale)
    got = attention.attention_decode(
        cp.asarray(q),
        cp.asarray(k_dev),
        cp.asarray(v_dev),
        cp.asarray(table),
        cp.asarray(slots),
        cp.asarray(pos),
        scale,
    )
    got = cp.asnumpy(got)
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.isfinite(got).all()
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= 1e-5, f"max error {err:.3g} of the output scale"


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    ("d", "nq", "nkv", "n"),
    [
        (64, 4, 4, 8),  # group 1
        (64, 4, 2, 5),  # the tiny models: group 2
        (32, 8, 4, 3),
        (128, 6, 2, 2),  # group 3
        (256, 24, 4, 8),  # Qwen3.5: group 6
        (256, 16, 2, 4),  # group 8
    ],
    ids=lambda x: str(x),
)
def test_attention_matches_reference(d: int, nq: int, nkv: int, n: int, bf16: bool) -> None:
    run_case(d, nq, nkv, n, bf16=bf16)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_attention_ignores_unused_pages(bf16: bool) -> None:
    run_case(64, 8, 2, 8, bf16=bf16, garbage=True, seed=1)
    run_case(256, 12, 2, 3, bf16=bf16, garbage=True, seed=2)


@pytest.mark.parametrize(
    ("page", "max_pages", "positions"),
    [
        (64, 313, [20031, 0, 12000]),  # 20032-token table: chunk 128, 157 splits
        (8, 5, [39, 3, 17]),  # a table shorter than one chunk: a single split
        (16, 1024, [16383, 9000]),  # 256 splits, the most the combine takes
        (16, 8, [500, 127]),  # a position past the table attends to all of it
    ],
)
def test_attention_split_policies(page: int, max_pages: int, positions: list[int]) -> None:
    run_case(
        64, 4, 2, len(positions), bf16=False, page=page, max_pages=max_pages, positions=positions
    )


def test_split_policy() -> None:
    assert attention.split_policy(40) == (64, 1)
    assert attention.split_policy(4096) == (64, 64)
    assert attention.split_policy(16384) == (64, 256)
    assert attention.split_policy(20032) == (128, 157)
    for ctx in (1, 127, 128, 129, 5000, 65536, 262144, 10**6):
        chunk, splits = attention.split_policy(ctx)
        assert chunk % 64 == 0 and splits <= attention.MAX_SPLITS
        assert (splits - 1) * chunk < ctx <= splits * chunk


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_kv_write(bf16: bool) -> None:
    import cupy as cp

    rng = np.random.default_rng(3)
    n, nkv, d, page, max_pages = 6, 2, 64, 16, 8
    k_pool, v_pool, table, slots = make_pool(rng, n, nkv, d, page, max_pages)
    if bf16:
        k_pool, v_pool = f32_to_bf16(k_pool), f32_to_bf16(v_pool)
    pos = np.array([0, 15, 16, 127, 40, 1], dtype=np.int32)
    k = rng.standard_normal((n, nkv, d)).astype(np.float32)
    v = rng.standard_normal((n, nkv, d)).astype(np.float32)
    # rounding corner cases: ties to even both ways, NaN payloads, infinities, huge values
    k[0, 0, :8] = (
        np.array(
            [0x3F808000, 0x3F818000, 0x7F800001, 0xFFC00000, 0x7F800000, 0x7F7FFFFF, 0x80000001, 0]
        )
        .astype(np.uint32)
        .view(np.float32)
    )
    k_dev, v_dev = cp.asarray(k_pool), cp.asarray(v_pool)
    attention.kv_write(
        k_dev,
        v_dev,
        cp.asarray(table),
        cp.asarray(slots),
        cp.asarray(pos),
        cp.asarray(k),
        cp.asarray(v),
    )
    p = table[slots, pos // page]
    k_pool[p, pos % page] = f32_to_bf16(k) if bf16 else k
    v_pool[p, pos % page] = f32_to_bf16(v) if bf16 else v
    # bit-exact, NaN payloads included
    width = np.uint16 if bf16 else np.uint32
    np.testing.assert_array_equal(cp.asnumpy(k_dev).view(width), k_pool.view(width))
    np.testing.assert_array_equal(cp.asnumpy(v_dev).view(width), v_pool.view(width))


def test_to_bf16_bits() -> None:
    import cupy as cp

    rng = np.random.default_rng(4)
    bits = rng.integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), rng.standard_normal(1000).astype(np.float32)])
    got = cp.asnumpy(attention.to_bf16_bits(cp.asarray(x.reshape(-1, 8))))
    np.testing.assert_array_equal(got.reshape(-1), f32_to_bf16(x))


def test_bad_arguments_named() -> None:
    import cupy as cp

    q = cp.zeros((1, 4, 64), dtype=cp.float32)
    pool = cp.zeros((4, 16, 2, 64), dtype=cp.float32)
    table = cp.zeros((1, 4), dtype=cp.int32)
    lane = cp.zeros(1, dtype=cp.int32)
    with pytest.raises(ValueError, match="page_table"):
        attention.attention_decode(q, pool, pool, table.astype(cp.int64), lane, lane, 0.1)
    with pytest.raises(ValueError, match="v_pages"):
        attention.attention_decode(q, pool, pool.astype(cp.uint16), table, lane, lane, 0.1)
    with pytest.raises(ValueError, match="q"):
        attention.attention_decode(q[:, :3], pool, pool, table, lane, lane, 0.1)
    with pytest.raises(ValueError, match="k_pages"):
        attention.attention_decode(q, pool[..., :48], pool[..., :48], table, lane, lane, 0.1)
    with pytest.raises(ValueError, match="positions"):
        attention.kv_write(pool, pool, table, lane, cp.zeros(2, cp.int32), q[:, :2], q[:, :2])


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_graph_capture_replays_with_new_positions(bf16: bool) -> None:
    """kv_write + attention captured once, replayed after the positions changed."""
    import cupy as cp

    rng = np.random.default_rng(5)
    n, nq, nkv, d, page, max_pages = 3, 12, 2, 256, 16, 64
    k_pool, v_pool, table, slots = make_pool(rng, n, nkv, d, page, max_pages)
    if bf16:
        k_pool, v_pool = f32_to_bf16(k_pool), f32_to_bf16(v_pool)
    host = {"k_pool": k_pool, "v_pool": v_pool, "table": table, "slots": slots}
    dev = {name: cp.asarray(a) for name, a in host.items()}
    dev["pos"] = cp.zeros(n, cp.int32)
    q_dev = cp.zeros((n, nq, d), cp.float32)
    k_dev = cp.zeros((n, nkv, d), cp.float32)
    v_dev = cp.zeros((n, nkv, d), cp.float32)

    def step() -> Any:
        attention.kv_write(
            dev["k_pool"], dev["v_pool"], dev["table"], dev["slots"], dev["pos"], k_dev, v_dev
        )
        return attention.attention_decode(
            q_dev, dev["k_pool"], dev["v_pool"], dev["table"], dev["slots"], dev["pos"], 0.07
        )

    stream = cp.cuda.Stream(non_blocking=True)
    pool = cp.cuda.MemoryPool()  # the graph's own memory: its addresses stay valid
    with stream:
        step()  # compile and load the kernels outside the capture (it writes zeros at 0)
        stream.synchronize()
        zeros = np.zeros((n, nkv, d), np.float32)
        array_ops.kv_write(k_pool, v_pool, table, slots, np.zeros(n, np.int32), zeros, zeros)
        with cp.cuda.using_allocator(pool.malloc):
            stream.begin_capture()
            out = step()
            graph = stream.end_capture()
        for positions in ([5, 0, 1000], [16, 700, 1023], [1, 2, 3]):
            pos = np.array(positions, dtype=np.int32)
            q = rng.standard_normal((n, nq, d)).astype(np.float32)
            k = rng.standard_normal((n, nkv, d)).astype(np.float32)
            v = rng.standard_normal((n, nkv, d)).astype(np.float32)
            for buf, host in ((dev["pos"], pos), (q_dev, q), (k_dev, k), (v_dev, v)):
                buf.set(host, stream=stream)
            graph.launch(stream)
            got = out.get(stream=stream)
            stream.synchronize()
            array_ops.kv_write(k_pool, v_pool, table, slots, pos, k, v)  # rounds for bf16 pools
            kf, vf = (bf16_to_f32(k_pool), bf16_to_f32(v_pool)) if bf16 else (k_pool, v_pool)
            want = array_ops.attention_decode(q, kf, vf, table, slots, pos, 0.07)
            err = np.abs(got - want).max() / np.abs(want).max()
            assert err <= 1e-5, f"positions {positions}: max error {err:.3g}"
