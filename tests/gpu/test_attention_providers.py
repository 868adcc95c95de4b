"""Every attention ``prefill`` provider the policy can pick on CUDA against the family's
reference (the gathered rows attended in float64), within the provider's stated
``TOLERANCE``: the 27B's heads (24 query / 4 key-value, D 256) and an awkward small layout, a
first chunk and one after earlier context, K/V stored as float32 and as bf16 words, pages in
a shuffled order."""

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
