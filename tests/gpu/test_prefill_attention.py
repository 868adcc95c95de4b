"""Flash-style prefill attention over the paged pool against ``array_ops.attention`` run in
numpy (float64) on the stored, decoded keys and values.

Sizes are awkward on purpose: T not a multiple of the 64-row block or of the key tile, later
chunks (start > 0, also not a multiple of the page), page lists reaching past start + T whose
unused rows hold NaN (the kernel must never read them), page ids shuffled and never the first
ones, pages of 256 tokens (the pool's), of 48 (a key tile spans two pages) and of 5 (a thread's
rows step over several pages), float32, bfloat16 and E4M3 pools, GQA groups 1..8 and head dims
64/128/256. Row blocks with few keys, a single query over a long context and explicit split
counts (some splits then have no key for early rows) exercise the split-K path and its
combine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_runtime.backends import array_ops
from ninfer_runtime.backends.cuda import prefill_attention as pfa
from ninfer_runtime.state import KV_DTYPES, load_kv, store_kv

from .conftest import REPORT, requires_gpu

pytestmark = requires_gpu

#: max|got - want| / max|want| allowed per precision. 3xTF32 products are float32-grade;
#: split_qk keeps the scores float32-grade, so only P.V's TF32 rounding remains (~3e-4 in
#: the emulation, independent of how peaked the attention is); bf16 keeps the scores to
#: about 16 bits and rounds P and V to bf16 (2^-9 each).
TOLERANCE = {"split": 2e-5, "split_qk": 2e-3, "bf16": 6e-3}

#: (D, Nq, Nkv, T, start, extra rows the page list reaches past start + T, splits or None)
CASES = [
    (64, 4, 4, 37, 0, 0, None),  # group 1, first chunk
    (64, 4, 2, 100, 23, 50, None),  # tiny models: group 2
    (64, 3, 1, 90, 261, 7, None),  # group 3, start past a page boundary
    (64, 8, 2, 300, 0, 0, 5),  # forced splits, empty for the early rows
    (128, 12, 2, 77, 300, 23, None),  # group 6
    (128, 6, 2, 50, 517, 0, None),  # group 3
    (128, 8, 1, 65, 1000, 0, None),  # group 8, a later chunk
    (128, 8, 2, 1, 777, 10, None),  # one query over a long context: split-K
    (256, 24, 4, 200, 513, 87, None),  # Qwen3.6-27B geometry
    (256, 16, 2, 130, 0, 5, None),  # 35B-A3B geometry
    (256, 24, 4, 5, 3000, 0, None),  # a short chunk after a long context: split-K
    (256, 16, 2, 90, 200, 3, 7),  # forced splits at D = 256
    (256, 24, 4, 700, 1300, 0, None),  # a long chunk
]
#: the storage of every K/V type the pool has, and page sizes to lay the context out in
KV_TYPES = tuple(KV_DTYPES)
PAGES = (256, 48, 5)


def case_id(case: tuple[Any, ...]) -> str:
    d, nq, nkv, t, start, extra, splits = case
    return f"D{d}-q{nq}kv{nkv}-T{t}-start{start}+{extra}" + (f"-split{splits}" if splits else "")


def shuffled_pages(tokens: int, page: int, rng: np.random.Generator) -> np.ndarray:
    """Page ids (int32) for ``tokens`` tokens in ``page``-token pages: a shuffled choice
    among a few more pages than needed."""
    count = -(-tokens // page)
    return rng.permutation(count + 3)[:count].astype(np.int32)


def pool_of(stored: np.ndarray, pages: np.ndarray, page: int) -> np.ndarray:
    """Stored rows [S, Nkv, D] laid out as a pool holds them: token t at row ``t % page`` of
    page ``pages[t // page]``; every other row of the pool is a stored NaN."""
    nan = store_kv(np.full(1, np.nan, np.float32), stored.dtype)[0]
    pool = np.full((int(pages.max()) + 1, page, *stored.shape[1:]), nan, stored.dtype)
    positions = np.arange(stored.shape[0])
    pool[pages[positions // page], positions % page] = stored
    return pool


def make(
    rng: np.random.Generator,
    case: tuple[Any, ...],
    *,
    mag: float = 1.0,
    kv_dtype: str = "float32",
    page: int = 256,
) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """(q, k_pages, v_pages, pages) for ``case`` and the float64 oracle over the stored keys
    and values as attention reads them back."""
    d, nq, nkv, t, start, extra, _ = case
    used = start + t
    q = (rng.standard_normal((t, nq, d)) * mag).astype(np.float32)
    k = store_kv(
        (rng.standard_normal((used, nkv, d)) * mag).astype(np.float32), KV_DTYPES[kv_dtype]
    )
    v = store_kv(rng.standard_normal((used, nkv, d)).astype(np.float32), KV_DTYPES[kv_dtype])
    pages = shuffled_pages(used + extra, page, rng)
    want = array_ops.attention(
        q.astype(np.float64),
        load_kv(k).astype(np.float64),
        load_kv(v).astype(np.float64),
        start,
        1.0 / np.sqrt(d),
    )
    return (q, pool_of(k, pages, page), pool_of(v, pages, page), pages), want


def run(
    arrays: tuple[np.ndarray, ...], case: tuple[Any, ...], precision: str, splits: int | None = None
) -> np.ndarray:
    """The kernel's output for (q, k_pages, v_pages, pages) of ``case`` (its split count, or
    ``splits``)."""
    import cupy as cp

    d, start = case[0], case[4]
    q, k_pages, v_pages, pages = (cp.asarray(a) for a in arrays)
    got = pfa.prefill_attention(
        q,
        k_pages,
        v_pages,
        pages,
        start=start,
        scale=1.0 / np.sqrt(d),
        precision=precision,
        splits=case[6] if splits is None else splits,
    )
    return cp.asnumpy(got)


def run_case(
    case: tuple[Any, ...],
    precision: str,
    *,
    mag: float = 1.0,
    seed: int = 0,
    kv_dtype: str = "float32",
    page: int = 256,
) -> float:
    arrays, want = make(np.random.default_rng(seed), case, mag=mag, kv_dtype=kv_dtype, page=page)
    got = run(arrays, case, precision)
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.isfinite(got).all(), f"{int((~np.isfinite(got)).sum())} non-finite outputs"
    diff = np.abs(got - want)
    err = float(diff.max() / np.abs(want).max())
    worst = np.unravel_index(int(diff.argmax()), diff.shape)
    label = f"{case_id(case)} {precision} {kv_dtype} page{page}"
    label += f" x{mag:g}" if mag != 1.0 else ""
    print(f"{label}: max rel err {err:.2e} at (token, head, col) {tuple(int(i) for i in worst)}")
    REPORT.append((label, "prefill attention max|Δ|/max|ref|", f"{err:.2e}"))
    assert err <= TOLERANCE[precision], (
        f"{label}: max error {err:.3g} of the output scale at {worst} "
        f"(got {got[worst]:.6g}, want {want[worst]:.6g})"
    )
    return err


@pytest.mark.parametrize("precision", ["split", "split_qk", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_prefill_attention_matches_reference(case: tuple[Any, ...], precision: str) -> None:
    run_case(case, precision)


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("kv_dtype", KV_TYPES)
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[5], CASES[8], CASES[10]], ids=case_id)
def test_every_storage_and_page_size(case: tuple[Any, ...], kv_dtype: str, page: int) -> None:
    run_case(case, "split", kv_dtype=kv_dtype, page=page, seed=5)


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("kv_dtype", KV_TYPES)
@pytest.mark.parametrize("case", [CASES[2], CASES[8]], ids=case_id)
def test_bf16_products_for_every_storage(case: tuple[Any, ...], kv_dtype: str, page: int) -> None:
    run_case(case, "bf16", kv_dtype=kv_dtype, page=page, seed=1)


@pytest.mark.parametrize("precision", ["split", "split_qk", "bf16"])
@pytest.mark.parametrize("case", [CASES[4], CASES[8], CASES[11]], ids=case_id)
def test_prefill_attention_peaked_scores(case: tuple[Any, ...], precision: str) -> None:
    """q and k three times larger: score std ~9, nearly one-hot rows; the split score
    product keeps the error where it is for unit-scale inputs."""
    run_case(case, precision, mag=3.0, seed=2)


@pytest.mark.parametrize("kv_dtype", KV_TYPES)
@pytest.mark.parametrize("case", [CASES[2], CASES[8], CASES[11]], ids=case_id)
def test_layout_and_storage_do_not_change_the_arithmetic(
    case: tuple[Any, ...], kv_dtype: str
) -> None:
    """The same stored keys and values give the same output bit for bit: in one page holding
    the whole context in order, in shuffled pages of 48 or 5 tokens, and (bf16, E4M3) from a
    float32 pool of their decoded values. Pages only change where a tile row is read from,
    and the narrow types decode exactly before any product. (The split count is fixed: the
    policy may pick another for another storage's shared memory.)"""
    case = (*case[:6], case[6] or 3)
    (q, k_pages, v_pages, pages), _ = make(np.random.default_rng(6), case, kv_dtype=kv_dtype)
    used = case[3] + case[4]
    positions = np.arange(used)
    k = k_pages[pages[positions // 256], positions % 256]  # the stored rows, in order
    v = v_pages[pages[positions // 256], positions % 256]
    first = np.zeros(1, np.int32)
    want = run((q, k[None], v[None], first), case, "split_qk")
    rng = np.random.default_rng(7)
    for page in (48, 5):
        ids = shuffled_pages(used, page, rng)
        got = run((q, pool_of(k, ids, page), pool_of(v, ids, page), ids), case, "split_qk")
        np.testing.assert_array_equal(got, want, err_msg=f"{kv_dtype} in pages of {page}")
    if kv_dtype != "float32":
        got = run((q, load_kv(k)[None], load_kv(v)[None], first), case, "split_qk")
        np.testing.assert_array_equal(got, want, err_msg=f"{kv_dtype} against its float32")


def test_split_policy_matches_single_pass() -> None:
    """Every split count gives the single-pass result up to float32 reassociation (3xTF32:
    with TF32 P the rounding of p would depend on each split's own running max)."""
    case = (128, 8, 2, 40, 500, 0, None)
    arrays, _ = make(np.random.default_rng(3), case)
    one = run(arrays, case, "split", splits=1)
    for splits in (2, 3, 8, 17, 64):
        got = run(arrays, case, "split", splits=splits)
        err = np.abs(got - one).max() / np.abs(one).max()
        assert err <= 1e-5, f"splits={splits}: {err:.3g} from the single pass"


def test_backend_attention_pages(cuda_backend: Any) -> None:
    """The attention family's ``prefill`` on CUDA as the backend's precision resolves it (TF32
    off: 3xTF32 products) through a pool's page-table row, and its reference fallback for
    head dims the kernel does not take."""
    import cupy as cp

    from ninfer_runtime.ops import attention

    rng = np.random.default_rng(4)
    for case, kv_dtype in (
        ((256, 24, 4, 70, 130, 0, None), "float32"),
        ((128, 6, 2, 40, 21, 0, None), "bfloat16"),
        ((32, 4, 2, 9, 5, 0, None), "fp8_e4m3"),
        ((64, 6, 3, 33, 0, 0, None), "float32"),
    ):
        d, t, start = case[0], case[3], case[4]
        (q, k_pages, v_pages, pages), want = make(rng, case, kv_dtype=kv_dtype, page=16)
        table = np.zeros((3, pages.shape[0] + 4), np.int32)  # its row 1, as a pool keeps it
        table[1, : pages.shape[0]] = pages
        # a strided query view: the backend makes it contiguous
        q_dev = cp.asarray(np.concatenate([q, q], axis=2))[:, :, :d]
        precision = cuda_backend.prefill_precision
        k_dev = cp.asarray(k_pages)
        got = attention.resolved("prefill", "cuda", k_dev, precision=precision)(
            q_dev,
            k_dev,
            cp.asarray(v_pages),
            cp.asarray(table)[1],
            start=start,
            scale=1.0 / np.sqrt(d),
            precision=precision,
        )
        err = float(np.abs(cp.asnumpy(got) - want).max() / np.abs(want).max())
        label = f"backend D{d} q{case[1]}kv{case[2]} {kv_dtype}"
        REPORT.append((label, "attention max|Δ|/max|ref|", f"{err:.2e}"))
        assert got.shape == (t, case[1], d)
        assert err <= TOLERANCE["split"], f"D={d} {kv_dtype}: max error {err:.3g}"


def test_empty_chunk() -> None:
    import cupy as cp

    k = cp.zeros((1, 16, 2, 64), dtype=cp.float32)
    pages = cp.zeros(1, dtype=cp.int32)
    q = cp.zeros((0, 4, 64), dtype=cp.float32)
    out = pfa.prefill_attention(q, k, k, pages, start=10, scale=0.125)
    assert out.shape == (0, 4, 64)


def test_bad_arguments_named() -> None:
    import cupy as cp

    q = cp.zeros((8, 4, 64), dtype=cp.float32)
    k = cp.zeros((3, 8, 2, 64), dtype=cp.float32)
    pages = cp.asarray([2, 0, 1], dtype=cp.int32)

    def pool(*shape: int, dtype: Any = cp.float32) -> Any:
        return cp.zeros(shape, dtype=dtype)

    def call(**kw: Any) -> None:
        args = {"q": q, "k_pages": k, "v_pages": k, "pages": pages, "start": 0, "scale": 0.125}
        args.update(kw)
        pfa.prefill_attention(
            args.pop("q"), args.pop("k_pages"), args.pop("v_pages"), args.pop("pages"), **args
        )

    with pytest.raises(ValueError, match=r"^q: dtype"):
        call(q=q.astype(cp.float64))
    with pytest.raises(ValueError, match=r"^k_pages: expected a 4-d"):
        call(k_pages=k[0])
    with pytest.raises(ValueError, match=r"^k_pages: dtype"):
        call(k_pages=k.astype(cp.float16))
    with pytest.raises(ValueError, match=r"^v_pages: \(2, 8, 2, 64\)"):
        call(v_pages=k[:2])
    with pytest.raises(ValueError, match=r"^v_pages: .* uint16 differs"):
        call(v_pages=pool(3, 8, 2, 64, dtype=cp.uint16))
    with pytest.raises(ValueError, match=r"^pages: dtype int64"):
        call(pages=pages.astype(cp.int64))
    with pytest.raises(ValueError, match=r"^q: head dim 32"):
        call(q=q[:, :, :32].copy(), k_pages=k[..., :32].copy(), v_pages=k[..., :32].copy())
    with pytest.raises(ValueError, match=r"^k_pages: head dim"):
        call(k_pages=pool(3, 8, 2, 128), v_pages=pool(3, 8, 2, 128))
    with pytest.raises(ValueError, match=r"^q: 4 heads"):
        call(k_pages=pool(3, 8, 3, 64), v_pages=pool(3, 8, 3, 64))
    with pytest.raises(ValueError, match=r"^start: 17 \+ 8 queries exceeds the 3 pages of 8"):
        call(start=17)
    with pytest.raises(ValueError, match=r"^start:"):
        call(start=-1)
    with pytest.raises(ValueError, match=r"^precision:"):
        call(precision="fp16")
    with pytest.raises(ValueError, match=r"^q: must be C-contiguous"):
        call(q=cp.zeros((8, 4, 128), dtype=cp.float32)[:, :, :64])
    with pytest.raises(ValueError, match=r"^q: must be 16-byte aligned"):
        call(q=cp.zeros(8 * 4 * 64 + 1, dtype=cp.float32)[1:].reshape(8, 4, 64))
    with pytest.raises(ValueError, match=r"^pages: must be C-contiguous"):
        call(pages=cp.zeros(6, dtype=cp.int32)[::2])
    assert not pfa.supported(q[:, :, :32], k[..., :32], k[..., :32])
    assert not pfa.supported(q.astype(cp.float64), k, k)
    assert not pfa.supported(q, k[0], k[0])
    assert pfa.supported(q, k, k)
    assert pfa.supported(q, k.astype(cp.uint8), k.astype(cp.uint8))
