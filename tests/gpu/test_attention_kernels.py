"""Paged decode attention and the KV write against ``array_ops`` run in numpy.

Page tables are shuffled, lanes sit at awkward positions (0, 1, a page's last row, the next
page's first, thousands of tokens, the table's last token), and bf16 and fp8 (E4M3FN) pools are
compared with the oracle run on the same rounded values, so every storage type gets the same
tight tolerance. The KV write must store exactly the bytes of the numpy encoders.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_format.numeric import bf16_to_f32, e4m3fn_to_f32, f32_to_bf16, f32_to_e4m3fn
from ninfer_runtime.backends import array_ops
from ninfer_runtime.backends.cuda import attention
from ninfer_runtime.state import load_kv, store_kv

from .conftest import requires_gpu

pytestmark = requires_gpu

#: lane positions, taken in order (PAGE = 16 in most cases)
POSITIONS = [3100, 0, 1, 15, 16, 700, 4095, 2047]
#: pool storage -> (float32 into the pool's dtype, the pool's values as float32)
STORAGE = {
    "fp32": (np.copy, np.copy),
    "bf16": (f32_to_bf16, bf16_to_f32),
    "fp8": (f32_to_e4m3fn, e4m3fn_to_f32),
}
KINDS = list(STORAGE)
#: float32 values where the encoders' rounding is easy to get wrong: ties to even (bf16 and
#: fp8, normal and subnormal), NaN payloads and signs, infinities, saturation past 448,
#: float32 subnormals, -0 and the edge of fp8's normal range
CORNERS = np.concatenate(
    [
        np.array(
            [0x3F808000, 0x3F818000, 0x7F800001, 0xFFC00000, 0x7F800000, 0x7F7FFFFF, 0x80000001],
            dtype=np.uint32,
        ).view(np.float32),
        np.float32(
            [
                *(1.0625, 1.1875, -1.0625, 448, 464, -464, 448.5, 1e30, -np.inf, -500),
                *(2**-10, 3 * 2**-10, -(2**-10), 2**-6 - 2**-12, 2**-6 - 2**-11),
                *(-0.0, 0.0, -np.nan),
            ]
        ),
    ]
)


def widen(rng: np.random.Generator, a: np.ndarray) -> None:
    """Scale a random 0.1% of ``a`` by 600: values beyond fp8's +-448 (they saturate)."""
    a[rng.random(a.shape) < 1e-3] *= 600


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
    kv: str,
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
    encode, decode = STORAGE[kv]
    if kv == "fp8":
        widen(rng, k)
        widen(rng, v)
    k_dev, v_dev = encode(k), encode(v)
    k, v = decode(k_dev), decode(v_dev)  # what the kernel sees
    if garbage:  # rows nobody attends to: NaN and huge values the kernel must never touch
        unused = ~used_rows(table, slots, pos, page)
        k[unused] = 0.0
        v[unused] = 0.0
        bad = np.where(rng.random(unused.sum()) < 0.5, np.nan, 3e38).astype(np.float32)
        bad = encode(bad)
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
    # float32 sums in another order (split-K partials, online softmax): ~1e-5 of the scale
    assert err <= 3e-5, f"max error {err:.3g} of the output scale"


@pytest.mark.parametrize("kv", KINDS)
@pytest.mark.parametrize(
    ("d", "nq", "nkv", "n"),
    [
        (64, 4, 4, 8),  # group 1
        (64, 4, 2, 5),  # the tiny models: group 2
        (32, 8, 4, 3),
        (128, 6, 2, 2),  # group 3
        (256, 24, 4, 8),  # Qwen3.5: group 6
        (256, 16, 2, 4),  # group 8
        (256, 24, 2, 3),  # Qwen4Exp: group 12, two launches of 6
        (64, 27, 3, 2),  # group 9: nine launches of 1
    ],
    ids=lambda x: str(x),
)
def test_attention_matches_reference(d: int, nq: int, nkv: int, n: int, kv: str) -> None:
    run_case(d, nq, nkv, n, kv=kv)


@pytest.mark.parametrize("kv", KINDS)
def test_attention_ignores_unused_pages(kv: str) -> None:
    run_case(64, 8, 2, 8, kv=kv, garbage=True, seed=1)
    run_case(256, 12, 2, 3, kv=kv, garbage=True, seed=2)
    run_case(32, 4, 1, 3, kv=kv, garbage=True, seed=3)


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
    for kv in ("fp32", "fp8"):
        run_case(
            64, 4, 2, len(positions), kv=kv, page=page, max_pages=max_pages, positions=positions
        )


@pytest.mark.parametrize("kv", KINDS)
def test_kv_write(kv: str) -> None:
    import cupy as cp

    rng = np.random.default_rng(3)
    n, nkv, d, page, max_pages = 6, 2, 64, 16, 8
    encode, _ = STORAGE[kv]
    k_pool, v_pool, table, slots = make_pool(rng, n, nkv, d, page, max_pages)
    k_pool, v_pool = encode(k_pool), encode(v_pool)
    pos = np.array([0, 15, 16, 127, 40, 1], dtype=np.int32)
    k = rng.standard_normal((n, nkv, d)).astype(np.float32)
    v = rng.standard_normal((n, nkv, d)).astype(np.float32)
    widen(rng, v)
    k[0, 0, : len(CORNERS)] = CORNERS
    v[1, 1, -len(CORNERS) :] = CORNERS
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
    k_pool[p, pos % page] = encode(k)
    v_pool[p, pos % page] = encode(v)
    # bit-exact, NaN payloads included
    width = np.uint32 if kv == "fp32" else k_pool.dtype
    np.testing.assert_array_equal(cp.asnumpy(k_dev).view(width), k_pool.view(width))
    np.testing.assert_array_equal(cp.asnumpy(v_dev).view(width), v_pool.view(width))


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_kv_write_encodes_like_numpy(kv: str) -> None:
    """Every sign, exponent and 3-bit fraction with the low 20 bits at and around fp8's
    rounding midpoint, random bit patterns and the corners, through the kernel: the bytes of
    the numpy encoder, and of ``kv_storage.store_kv`` on device arrays (the prefill path)."""
    import cupy as cp

    encode, _ = STORAGE[kv]
    high = np.arange(1 << 12, dtype=np.uint32) << 20
    low = np.array([0, 1, 0x7FFFF, 0x80000, 0x80001, 0xFFFFF], dtype=np.uint32)
    rng = np.random.default_rng(7)
    random = rng.integers(0, 2**32, 1 << 15, dtype=np.uint64).astype(np.uint32)
    bits = np.concatenate([(high[:, None] | low[None, :]).ravel(), random])
    x = np.concatenate([bits.view(np.float32), CORNERS])
    n, nkv, d, page = 128, 2, 256, 16
    x = np.resize(x, (2, n, nkv, d))  # repeats from the start to fill k and v
    pool = np.zeros((n // page, page, nkv, d), np.float32)
    k_dev, v_dev = cp.asarray(encode(pool)), cp.asarray(encode(pool))
    table = cp.arange(n // page, dtype=cp.int32)[None]
    slots, pos = cp.zeros(n, cp.int32), cp.arange(n, dtype=cp.int32)
    attention.kv_write(k_dev, v_dev, table, slots, pos, cp.asarray(x[0]), cp.asarray(x[1]))
    np.testing.assert_array_equal(cp.asnumpy(k_dev).reshape(n, nkv, d), encode(x[0]))
    np.testing.assert_array_equal(cp.asnumpy(v_dev).reshape(n, nkv, d), encode(x[1]))
    stored = store_kv(cp.asarray(x), k_dev.dtype)
    np.testing.assert_array_equal(cp.asnumpy(stored), encode(x))
    codes = cp.arange(1 << (8 * k_dev.dtype.itemsize), dtype=cp.uint32).astype(k_dev.dtype)
    _, decode = STORAGE[kv]
    want = decode(cp.asnumpy(codes)).view(np.uint32)
    np.testing.assert_array_equal(cp.asnumpy(load_kv(codes)).view(np.uint32), want)


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


@pytest.mark.parametrize("kv", KINDS)
def test_graph_capture_replays_with_new_positions(kv: str) -> None:
    """kv_write + attention captured once, replayed after the positions changed."""
    import cupy as cp

    rng = np.random.default_rng(5)
    n, nq, nkv, d, page, max_pages = 3, 12, 2, 256, 16, 64
    k_pool, v_pool, table, slots = make_pool(rng, n, nkv, d, page, max_pages)
    encode, decode = STORAGE[kv]
    k_pool, v_pool = encode(k_pool), encode(v_pool)
    host = {"k_pool": k_pool, "v_pool": v_pool, "table": table, "slots": slots}
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:  # a non-blocking stream does not wait for uploads on the legacy one
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
            array_ops.kv_write(k_pool, v_pool, table, slots, pos, k, v)  # rounds as the pool's
            kf, vf = decode(k_pool), decode(v_pool)
            want = array_ops.attention_decode(q, kf, vf, table, slots, pos, 0.07)
            err = np.abs(got - want).max() / np.abs(want).max()
            assert err <= 1e-5, f"positions {positions}: max error {err:.3g}"
