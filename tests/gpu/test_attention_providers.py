"""Every attention ``prefill`` provider the policy can pick on CUDA against the family's
reference (the gathered rows attended in float64), within the provider's stated
``TOLERANCE``: the 27B's heads (24 query / 4 key-value, D 256) and an awkward small layout, a
first chunk and one after earlier context, K/V stored as float32 and as bf16 words, pages in
a shuffled order. And ``decode`` resolved by the query heads a kv head has."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.backends.array_ops import attention
from ninfer_runtime.kv_storage import kv_storage_dtype, load_kv, store_kv
from ninfer_runtime.ops import registry
from ninfer_runtime.ops.attention import policy
from ninfer_runtime.ops.attention.reference import TOLERANCE

from .conftest import requires_gpu

pytestmark = requires_gpu

PAGE = 256
PROVIDERS = [n for n in policy.TABLE[("prefill", "cuda")] if n != "reference"]
#: (queries, start, query heads, key/value heads, head size)
CASES = [(300, 0, 24, 4, 256), (77, 400, 6, 2, 64)]


@pytest.mark.parametrize("storage", ["float32", "bf16"])
@pytest.mark.parametrize(("t", "start", "nq", "nkv", "d"), CASES)
@pytest.mark.parametrize("name", PROVIDERS)
def test_provider_matches_the_reference(
    name: str, t: int, start: int, nq: int, nkv: int, d: int, storage: str
) -> None:
    import cupy as cp

    provider = registry.providers("attention")["prefill"][name]
    if not provider.available():
        pytest.skip(f"attention.{name} needs {', '.join(provider.requires)} (not installed)")
    precision = "bf16"
    key = {"device": "cuda", "precision": precision, "head_dim": d, "storage": storage}
    assert provider.takes(key), f"attention.{name} declines {key}"
    rng = np.random.default_rng(t + start)
    length = start + t
    count = -(-length // PAGE) + 2
    pages = rng.permutation(count)[: -(-length // PAGE)]
    k = rng.standard_normal((count, PAGE, nkv, d)).astype(np.float32)
    v = rng.standard_normal((count, PAGE, nkv, d)).astype(np.float32)
    q = rng.standard_normal((t, nq, d)).astype(np.float32)
    dtype = kv_storage_dtype({"float32": "float32", "bf16": "bfloat16"}[storage])
    k_stored, v_stored = (np.asarray(store_kv(a, dtype)) for a in (k, v))
    gather = [(a[pages].reshape(-1, nkv, d)[:length]) for a in (k_stored, v_stored)]
    kr, vr = (np.asarray(load_kv(a), dtype=np.float64) for a in gather)
    want = attention(q.astype(np.float64), kr, vr, start, d**-0.5)
    got = provider.load()(
        cp.asarray(q), cp.asarray(k_stored), cp.asarray(v_stored), cp.asarray(pages),
        start=start, scale=d**-0.5, precision=precision,
    )  # fmt: skip
    rtol, atol = TOLERANCE[name]
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=rtol, atol=atol * scale)


@pytest.mark.parametrize("group", [6, 8, 12, 24])
def test_decode_of_any_group_is_ours(group: int) -> None:
    """Our decode kernel is compiled for 1..8 query heads a kv head (Qwen3.5's 6); a layer of
    more (Qwen4Exp's 24 over 2) is served in equal shares of at most 8, one launch each, so
    it stays on ours (capturable, where the reference's products are not), and matches the
    reference's math."""
    import cupy as cp

    from ninfer_runtime.backends.array_ops import attention_decode
    from ninfer_runtime.ops.attention import resolved

    rng = np.random.default_rng(group)
    nkv, d, pages, lanes = 2, 128, 4, 3
    k = cp.asarray(rng.standard_normal((pages, PAGE, nkv, d)), dtype=cp.float32)
    v = cp.asarray(rng.standard_normal((pages, PAGE, nkv, d)), dtype=cp.float32)
    q = cp.asarray(rng.standard_normal((lanes, group * nkv, d)), dtype=cp.float32)
    table = cp.asarray(rng.permutation(pages).reshape(lanes + 1, 1)[:lanes], dtype=cp.int32)
    slots = cp.arange(lanes, dtype=cp.int32)
    positions = cp.asarray([5, 100, 255], dtype=cp.int32)
    decode = resolved("decode", "cuda", k, precision="bf16", group=group)
    assert decode is registry.providers("attention")["decode"]["nvrtc"].load()
    out = cp.asnumpy(decode(q, k, v, table, slots, positions, scale=d**-0.5))
    expected = attention_decode(  # the reference's math in float32 on the host
        *(cp.asnumpy(a) for a in (q, k, v, table, slots, positions)), d**-0.5
    )
    # float32 sums in another order (split partials, online softmax): ~1e-5 of the scale
    assert np.abs(out - expected).max() <= 3e-5 * np.abs(expected).max()


@pytest.mark.parametrize("storage", ["float32", "bf16"])
@pytest.mark.parametrize(("nq", "nkv", "d"), [(24, 4, 256), (6, 2, 64)])
def test_prefill_lanes_packed_matches_each_lane_by_the_reference(
    nq: int, nkv: int, d: int, storage: str
) -> None:
    """``prefill_lanes`` as the policy resolves it on CUDA (``varlen``: one call for every
    lane) against the reference lane by lane: lanes of 1 to 300 rows, a first chunk and
    chunks after earlier context (one past a page's end), pages shuffled, within the
    provider's tolerance of the largest value."""
    import cupy as cp

    from ninfer_runtime.ops.attention import resolved

    rng = np.random.default_rng(nq + d)
    #: (rows, start) of each lane, in row order
    shapes = [(300, 0), (1, 700), (77, 256), (5, 1000), (130, 3)]
    widest = max(-(-(t + s) // PAGE) for t, s in shapes)
    count = widest * len(shapes)
    table = rng.permutation(count).reshape(len(shapes), widest).astype(np.int32)
    k = rng.standard_normal((count, PAGE, nkv, d)).astype(np.float32)
    v = rng.standard_normal((count, PAGE, nkv, d)).astype(np.float32)
    q = rng.standard_normal((sum(t for t, _ in shapes), nq, d)).astype(np.float32)
    dtype = kv_storage_dtype({"float32": "float32", "bf16": "bfloat16"}[storage])
    k_stored, v_stored = (np.asarray(store_kv(a, dtype)) for a in (k, v))
    kr, vr = (np.asarray(load_kv(a), dtype=np.float64) for a in (k_stored, v_stored))
    want, at = [], 0
    for (t, start), pages in zip(shapes, table, strict=True):
        rows = [a[pages].reshape(-1, nkv, d)[: start + t] for a in (kr, vr)]
        want.append(attention(q[at : at + t].astype(np.float64), *rows, start, d**-0.5))
        at += t
    expected = np.concatenate(want)

    k_dev, v_dev = cp.asarray(k_stored), cp.asarray(v_stored)
    packed = resolved("prefill_lanes", "cuda", k_dev, precision="bf16", group=nq // nkv)
    assert packed is registry.providers("attention")["prefill_lanes"]["varlen"].load()
    lanes = [(t, s, cp.asarray(p)) for (t, s), p in zip(shapes, table, strict=True)]
    one_lane = resolved("prefill", "cuda", k_dev, precision="bf16", group=nq // nkv)
    got = packed(cp.asarray(q), k_dev, v_dev, lanes, scale=d**-0.5, precision="bf16",
                 one_lane=one_lane)  # fmt: skip
    _, atol = TOLERANCE["varlen"]
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(cp.asnumpy(got), expected, rtol=0, atol=atol * scale)
