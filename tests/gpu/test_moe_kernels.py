"""The device-side MoE decode path (``backends/cuda/moe.py``) against numpy and the CPU backend.

The router kernel against a numpy top-k (ties included), the prefill pair grouping against
its numpy definition, the expert-indexed GEMV of every
layout against the numpy decoders with experts stacked in one object and stored apart, the
whole ``moe_decode`` against the moe family's reference ``block`` on the CPU, and a
CUDA-graph capture replayed on new inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer_format.codecs import codec_for
from ninfer_runtime.backends.base import ExpertWeights, MoeWeights
from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.backends.cuda import formats as F
from ninfer_runtime.backends.cuda.weights import PackedWeight, Parent, Segment
from ninfer_runtime.ops.moe import reference as moe_reference

from .conftest import requires_gpu

pytestmark = requires_gpu

RS = "row_split_k128_v1"
LAYOUTS = {
    "q4_g64_fp16": RS,
    "q5_g64_fp16": RS,
    "q6_g64_fp16": RS,
    "q8_g32_fp16": RS,
    "nf4_g64_fp16": RS,
    "nvfp4": "block_scale_k16_m128x4_v1",
    "fp8_e4m3fn_row_bf16": "row_scale_v1",
    "bf16": "contiguous_le_v1",
}


def resident(values: np.ndarray, fmt: str, divisors: int = 1) -> tuple[Parent, np.ndarray]:
    """A resident object holding ``values`` encoded in ``fmt``, and its decoded values."""
    import cupy as cp

    layout = LAYOUTS[fmt]
    codec = codec_for(fmt, layout)
    raw = np.frombuffer(codec.encode(values.astype(np.float32), divisors), dtype=np.uint8)
    decoded = codec.decode(raw, values.shape, divisors)
    return Parent("test", cp.asarray(raw), F.planes(fmt, layout, values.shape, divisors)), decoded


def numpy_route(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = e / e.sum(axis=-1, keepdims=True)
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    share = np.take_along_axis(probs, top, axis=-1)
    return top, share / share.sum(axis=-1, keepdims=True)


# ------------------------------------------------------------------------------ pair groups
@pytest.mark.parametrize(
    ("tokens", "experts", "k", "size"),
    [
        (0, 4, 2, 32),  # no pairs
        (1, 4, 2, 32),
        (700, 1, 1, 32),  # one expert
        (65, 10, 3, 8),
        (64, 8, 8, 32),  # exactly one chunk of pairs (moe_routing.CHUNK_PAIRS)
        (65, 8, 8, 32),  # one pair into the next chunk
        (700, 64, 8, 96),
        (2048, 256, 8, 96),
        (300, 1024, 4, 32),
        (4095, 128, 16, 96),  # the most pairs a pass takes: 128 chunks
    ],
)
def test_pair_groups_on_the_device_match_numpy(tokens, experts, k, size) -> None:
    """The two grouping kernels lay the pairs out exactly as the numpy definition does (row,
    group expert and source of every row), popular and empty experts included, for pair
    counts of one chunk, several and none."""
    import cupy as cp

    from ninfer_runtime.backends.cuda.moe import PairGroups

    rng = np.random.default_rng(tokens + experts)
    weights = rng.dirichlet(np.full(experts, 0.2))
    ids = np.array(
        [rng.choice(experts, size=k, replace=False, p=weights) for _ in range(tokens)],
        dtype=np.int32,
    ).reshape(tokens, k)
    want = PairGroups.of(ids, experts, size)
    got = PairGroups.of(cp.asarray(ids), experts, size)
    for field in ("row", "expert", "source", "live"):
        np.testing.assert_array_equal(cp.asnumpy(getattr(got, field)), getattr(want, field))


# ------------------------------------------------------------------------------------ router
@pytest.mark.parametrize("n,e,k", [(1, 10, 3), (8, 37, 5), (3, 512, 8), (2, 300, 1), (4, 8, 8)])
@pytest.mark.parametrize("ties", [False, True])
def test_router(n: int, e: int, k: int, ties: bool, cuda_backend: Any) -> None:
    import cupy as cp

    from ninfer_runtime.backends.cuda.moe import route

    rng = np.random.default_rng(e + k)
    if ties:  # few distinct values: many exact ties, broken toward the lower expert
        logits = (rng.integers(0, 4, (n, e)) / 2).astype(np.float32)
    else:
        logits = (3 * rng.standard_normal((n, e))).astype(np.float32)
    ids, shares = route(cp.asarray(logits), k)
    top, share = numpy_route(logits, k)
    assert np.array_equal(cp.asnumpy(ids), top)
    np.testing.assert_allclose(cp.asnumpy(shares), share, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("n,e,k", [(1, 10, 3), (8, 256, 8), (3, 512, 10)])
@pytest.mark.parametrize("ties", [False, True])
def test_route_provider_matches_the_reference(
    n: int, e: int, k: int, ties: bool, cuda_backend: Any
) -> None:
    """The moe family's ``route`` on CUDA (``nvrtc``: the router kernel given log(probs), as
    expert offload's split routes) against the reference on the same probabilities: the same
    experts, ties to the lower index, and the renormalised shares to rounding."""
    import cupy as cp

    from ninfer_runtime.backends.array_ops import softmax
    from ninfer_runtime.ops import registry
    from ninfer_runtime.ops.moe.reference import route as reference_route

    rng = np.random.default_rng(e + k + ties)
    logits = (rng.integers(0, 4, (n, e)) / 2) if ties else 3 * rng.standard_normal((n, e))
    probs = softmax(logits.astype(np.float32))
    top, share = reference_route(probs, k)
    ids, shares = registry.providers("moe")["route"]["nvrtc"].load()(cp.asarray(probs), k)
    assert np.array_equal(cp.asnumpy(ids), top)
    np.testing.assert_allclose(cp.asnumpy(shares), share, rtol=2e-6, atol=1e-7)


def test_router_with_nan_logits_chooses_experts_as_numpy_does(cuda_backend: Any) -> None:
    """Rows whose logits hold NaN (a broken activation upstream): every chosen id is an
    expert, as numpy's argsort places NaN after every value (its probabilities are then all
    NaN: the first k experts), with NaN shares; the other rows are untouched. An id past the
    experts would index the grouping kernels' tables out of bounds."""
    import cupy as cp

    from ninfer_runtime.backends.cuda.moe import route

    rng = np.random.default_rng(5)
    logits = (3 * rng.standard_normal((4, 300))).astype(np.float32)
    logits[1, 7] = np.nan
    logits[2, :] = np.nan
    ids, shares = route(cp.asarray(logits), 8)
    top, share = numpy_route(logits, 8)
    assert np.array_equal(cp.asnumpy(ids), top)
    assert cp.asnumpy(ids).max() < 300 and np.isnan(cp.asnumpy(shares)[1:3]).all()
    np.testing.assert_allclose(cp.asnumpy(shares), share, rtol=2e-6, atol=1e-7)


# ------------------------------------------------------------------------- expert-indexed GEMV
GEMV_CASES = [
    # (format, experts, rows per expert, K, divisors of the stacked object)
    ("q4_g64_fp16", 5, 72, 200, 1),
    ("q5_g64_fp16", 5, 72, 200, 1),
    ("q6_g64_fp16", 5, 72, 200, 1),
    ("q8_g32_fp16", 5, 72, 200, 1),
    ("nf4_g64_fp16", 5, 72, 200, 1),
    ("q8_g32_fp16", 3, 40, 1000, 1),
    ("nvfp4", 4, 128, 192, 4),
    ("nvfp4", 4, 96, 320, 1),  # experts start inside a 128-row scale tile
    ("fp8_e4m3fn_row_bf16", 5, 72, 208, 1),
    ("bf16", 5, 72, 200, 1),
]


def expert_objects(
    fmt: str, e: int, rows: int, k: int, divisors: int, stacked: bool, seed: int
) -> tuple[list[Segment], np.ndarray]:
    """One segment per expert and the decoded weights [E, rows, K]."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((e, rows, k)) * np.exp(rng.uniform(-2, 2, (e, rows, 1)))
    if stacked:
        parent, w = resident(values.reshape(e * rows, k), fmt, divisors)
        return [Segment(parent, i * rows, rows) for i in range(e)], w.reshape(e, rows, k)
    pairs = [resident(values[i], fmt) for i in range(e)]
    return [Segment(p, 0, rows) for p, _ in pairs], np.stack([w for _, w in pairs])


def check_pairs(got: Any, xs: np.ndarray, w: np.ndarray) -> None:
    """got[p] = w[p] @ xs[p] within float32 accumulation error (w: [P, rows, K])."""
    import cupy as cp

    got = cp.asnumpy(got).astype(np.float64)
    ref = np.einsum("prk,pk->pr", w.astype(np.float64), xs.astype(np.float64))
    bound = 2e-6 * np.einsum("prk,pk->pr", np.abs(w), np.abs(xs).astype(np.float64)) + 1e-30
    assert np.all(np.isfinite(got))
    ratio = np.max(np.abs(got - ref) / bound)
    assert ratio <= 1.0, f"error {ratio:.2f}x the float32 bound"


@pytest.mark.parametrize("stacked", [True, False], ids=["stacked", "separate"])
@pytest.mark.parametrize("case", GEMV_CASES, ids=lambda c: f"{c[0]}-{c[1]}x{c[2]}x{c[3]}")
def test_expert_gemv(case: Any, stacked: bool, cuda_backend: Any) -> None:
    import cupy as cp

    from ninfer_runtime.backends.cuda.moe import EXPERT_CONFIGS, Projection, expert_gemv

    fmt, e, rows, k, divisors = case
    if fmt == "nvfp4" and not stacked and rows % 128:
        pytest.skip("an NVFP4 object needs a multiple of 128 rows")
    segments, w = expert_objects(fmt, e, rows, k, divisors, stacked, seed=7)
    proj = Projection.build(segments)
    width = proj.planes.x_width
    rng = np.random.default_rng(8)
    for n, top in ((1, 1), (3, 4), (8, 3)):
        top = min(top, e)  # distinct experts in a row, as the router gives; rows share some
        ids = np.stack([rng.choice(e, top, replace=False) for _ in range(n)]).astype(np.int32)
        flat = ids.reshape(-1)
        ids_d = cp.asarray(ids)
        x = rng.standard_normal((n, k)).astype(np.float32)
        xp = np.zeros((n, width), np.float32)
        xp[:, :k] = x
        per_pair = rng.standard_normal((n * top, k)).astype(np.float32)
        pp = np.zeros((n * top, width), np.float32)
        pp[:, :k] = per_pair
        for r, ks in [(None, None), *EXPERT_CONFIGS]:
            y = cp.full((n * top, rows), np.nan, dtype=cp.float32)
            expert_gemv(proj, ids_d, cp.asarray(xp), False, y, rows, rows_per_warp=r, k_split=ks)
            check_pairs(y, np.repeat(x, top, axis=0), w[flat])
            y = cp.full((n * top, rows + 3), np.nan, dtype=cp.float32)  # ldy > rows
            expert_gemv(proj, ids_d, cp.asarray(pp), True, y, rows + 3, rows_per_warp=r, k_split=ks)
            check_pairs(y[:, :rows], per_pair, w[flat])


# ------------------------------------------------------------------------------- whole block
E, TOP_K, H, INTER = 10, 3, 96, 40


def random_moe(fmt: str, fused: bool, seed: int = 0) -> tuple[MoeWeights, MoeWeights]:
    """The same random MoE block as CUDA weights (packed) and CPU weights (decoded float32).
    ``fused``: every expert's gate|up rows in one object and all downs in another (stacked);
    otherwise each expert projection is an object of its own."""
    rng = np.random.default_rng(seed)

    def values(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols)) / np.sqrt(cols)

    def single(rows: int, cols: int) -> tuple[PackedWeight, np.ndarray]:
        parent, w = resident(values(rows, cols), fmt)
        return PackedWeight([Segment(parent, 0, rows)], (rows, cols)), w

    def mlp() -> tuple[ExpertWeights, ExpertWeights]:
        (g, gw), (u, uw), (d, dw) = single(INTER, H), single(INTER, H), single(H, INTER)
        return ExpertWeights(g, u, d), ExpertWeights(gw, uw, dw)

    if fused:
        gu_parent, gu = resident(values(E * 2 * INTER, H), fmt)
        down_parent, down = resident(values(E * H, INTER), fmt)
        gpu_experts, cpu_experts = [], []
        for e in range(E):
            a = e * 2 * INTER
            gpu_experts.append(
                ExpertWeights(
                    PackedWeight([Segment(gu_parent, a, INTER)], (INTER, H)),
                    PackedWeight([Segment(gu_parent, a + INTER, INTER)], (INTER, H)),
                    PackedWeight([Segment(down_parent, e * H, H)], (H, INTER)),
                )
            )
            cpu_experts.append(
                ExpertWeights(
                    gu[a : a + INTER], gu[a + INTER : a + 2 * INTER], down[e * H : (e + 1) * H]
                )
            )
    else:
        gpu_experts, cpu_experts = (list(t) for t in zip(*(mlp() for _ in range(E)), strict=True))
    (router, router_w), (score, score_w) = single(E, H), single(1, H)
    if fused:  # the shared expert's gate|up in one object too (its prefill takes the groups)
        sgu_parent, sgu = resident(values(2 * INTER, H), fmt)
        sd, sdw = single(H, INTER)
        shared_gpu = ExpertWeights(
            PackedWeight([Segment(sgu_parent, 0, INTER)], (INTER, H)),
            PackedWeight([Segment(sgu_parent, INTER, INTER)], (INTER, H)),
            sd,
        )
        shared_cpu = ExpertWeights(sgu[:INTER], sgu[INTER:], sdw)
    else:
        shared_gpu, shared_cpu = mlp()
    return (
        MoeWeights(router, gpu_experts, shared_gpu, score, TOP_K),
        MoeWeights(router_w, cpu_experts, shared_cpu, score_w, TOP_K),
    )


def cpu_moe(x: np.ndarray, weights: MoeWeights) -> np.ndarray:
    """The moe family's reference block on the CPU backend's products."""
    return moe_reference.block(CpuBackend(), x, weights)


def block(backend: Any, x: Any, weights: MoeWeights) -> Any:
    """The moe family's ``block`` as the CUDA policy resolves it (ours)."""
    from ninfer_runtime.ops.registry import resolve

    return resolve("moe", "block", device="cuda")(backend, x, weights)


def assert_close(got: Any, ref: np.ndarray) -> None:
    import cupy as cp

    got = cp.asnumpy(got)
    assert got.shape == ref.shape and np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


def assert_prefill_close(got: Any, ref: np.ndarray) -> None:
    """Prefill's tolerance: its shared expert (and, on the tensor cores, the routed ones) is a
    bf16 GEMM with float32 accumulation."""
    import cupy as cp

    got = cp.asnumpy(got)
    assert got.shape == ref.shape and np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=2e-2, atol=1e-2 * np.abs(ref).max())


@pytest.mark.parametrize("fused", [True, False], ids=["stacked", "separate"])
@pytest.mark.parametrize("fmt", ["q8_g32_fp16", "bf16", "q4_g64_fp16"])
def test_moe_decode_matches_cpu(fmt: str, fused: bool, cuda_backend: Any) -> None:
    import cupy as cp

    from ninfer_runtime.backends.cuda.moe import ExpertTable, moe_decode

    gpu_w, cpu_w = random_moe(fmt, fused)
    table = ExpertTable(gpu_w, cuda_backend.join_rows)
    assert table.fused == fused
    rng = np.random.default_rng(1)
    for n in range(1, 9):
        x = rng.standard_normal((n, H)).astype(np.float32)
        assert_close(moe_decode(cuda_backend, cp.asarray(x), table), cpu_moe(x, cpu_w))


@pytest.mark.parametrize("tensor_cores", [True, False], ids=["tensor-cores", "gemv"])
@pytest.mark.parametrize("fused", [True, False], ids=["stacked", "separate"])
@pytest.mark.parametrize("fmt", ["q8_g32_fp16", "bf16", "q4_g64_fp16"])
def test_moe_prefill_matches_cpu(
    fmt: str, fused: bool, tensor_cores: bool, cuda_backend: Any, monkeypatch: Any
) -> None:
    """Prefill rows (past the decode path's 64) through ``moe_prefill``: pairs grouped by
    expert, one launch per projection, on the tensor cores or the 8-row GEMV (the layouts
    without a tensor-core kernel); a chunk split in passes too (PREFILL_ROWS)."""
    import cupy as cp

    from ninfer_runtime.backends.cuda import moe
    from ninfer_runtime.backends.cuda.moe import ExpertTable, moe_prefill

    if not tensor_cores:
        monkeypatch.setattr(moe, "_tensor_core_groups", lambda table: False)

    gpu_w, cpu_w = random_moe(fmt, fused)
    table = ExpertTable(gpu_w, cuda_backend.join_rows)
    # bf16 rows of 96 or 40 values have no tensor-core kernel: the GEMV groups either way
    assert moe._tensor_core_groups(table) == (tensor_cores and fmt != "bf16")
    # the shared expert on the grouped product where its gate|up is one object
    assert (table.shared_groups is not None) == (fused and fmt != "bf16")
    rng = np.random.default_rng(2)
    for n in (65, 300):
        x = rng.standard_normal((n, H)).astype(np.float32)
        ref = cpu_moe(x, cpu_w)
        assert_prefill_close(moe_prefill(cuda_backend, cp.asarray(x), table), ref)
        assert_prefill_close(block(cuda_backend, cp.asarray(x), gpu_w), ref)  # the backend's choice
    passes = moe.PREFILL_ROWS
    try:
        moe.PREFILL_ROWS = 100
        x = rng.standard_normal((250, H)).astype(np.float32)
        assert_prefill_close(moe_prefill(cuda_backend, cp.asarray(x), table), cpu_moe(x, cpu_w))
    finally:
        moe.PREFILL_ROWS = passes


def test_expert_table_rejects_unreadable_experts(cuda_backend: Any) -> None:
    from ninfer_runtime.backends.cuda.moe import ExpertTable, ExpertTableError

    gpu_w, _ = random_moe("q8_g32_fp16", fused=False)
    ex = gpu_w.experts[0]
    two = PackedWeight([Segment(ex.gate.segments[0].parent, 0, INTER // 2)] * 2, (INTER, H))
    bad = MoeWeights(
        gpu_w.router,
        [ExpertWeights(two, ex.up, ex.down), *gpu_w.experts[1:]],
        gpu_w.shared,
        gpu_w.shared_score,
        TOP_K,
    )
    with pytest.raises(ExpertTableError):
        ExpertTable(bad, cuda_backend.join_rows)
    other, _ = random_moe("bf16", fused=False)  # one expert of another format
    mixed = MoeWeights(
        gpu_w.router,
        [other.experts[0], *gpu_w.experts[1:]],
        gpu_w.shared,
        gpu_w.shared_score,
        TOP_K,
    )
    with pytest.raises(ExpertTableError):
        ExpertTable(mixed, cuda_backend.join_rows)


def captured_decode(backend: Any, table: Any, x: Any, hits: Any = None) -> tuple[Any, ...]:
    """``moe_decode`` on ``x`` run eagerly once (it compiles and fills the pool), then
    captured on a stream of its own: (the eager output, the graph, the graph's output, its
    stream, the pool that holds the graph's addresses, never handed to anyone else)."""
    import cupy as cp

    from ninfer_runtime.backends.cuda.moe import moe_decode

    cp.cuda.Stream.null.synchronize()  # x (and hits), made on the default stream, are ready
    s = cp.cuda.Stream(non_blocking=True)
    pool = cp.cuda.MemoryPool()
    with s, cp.cuda.using_allocator(pool.malloc):
        warm = moe_decode(backend, x, table, hits)
        s.synchronize()
        s.begin_capture()
        try:
            out = moe_decode(backend, x, table, hits)
        finally:
            graph = s.end_capture()
    return warm, graph, out, s, pool


def test_moe_decode_in_a_cuda_graph(cuda_backend: Any) -> None:
    import cupy as cp

    from ninfer_runtime.backends.cuda.moe import ExpertTable

    gpu_w, cpu_w = random_moe("q8_g32_fp16", fused=True, seed=3)
    table = ExpertTable(gpu_w, cuda_backend.join_rows)
    n = 4
    rng = np.random.default_rng(4)
    first = rng.standard_normal((n, H)).astype(np.float32)
    x = cp.asarray(first)
    warm, graph, out, s, _pool = captured_decode(cuda_backend, table, x)
    assert_close(warm, cpu_moe(first, cpu_w))
    for _ in range(3):
        host = rng.standard_normal((n, H)).astype(np.float32)
        x.set(host, stream=s)
        graph.launch(s)
        s.synchronize()
        assert_close(out, cpu_moe(host, cpu_w))


def test_the_block_counts_its_routed_pairs_where_asked(cuda_backend: Any) -> None:
    """Weights with ``hits`` (expert offload's mapped decode): the block adds each routed pair
    to them on the device, captured steps' too (replayed three times), and in prefill's
    grouped path: expert by expert the counts the reference block gives on the CPU."""
    import dataclasses

    import cupy as cp

    from ninfer_runtime.backends.cuda.moe import ExpertTable

    gpu_w, cpu_w = random_moe("q8_g32_fp16", fused=True, seed=7)
    gpu_w = dataclasses.replace(gpu_w, hits=cp.zeros(E, dtype=cp.int32))
    cpu_w = dataclasses.replace(cpu_w, hits=np.zeros(E, dtype=np.int32))
    rng = np.random.default_rng(8)
    n = 8
    table = ExpertTable(gpu_w, cuda_backend.join_rows)
    x = cp.zeros((n, H), dtype=cp.float32)
    _warm, graph, _out, s, _pool = captured_decode(cuda_backend, table, x, gpu_w.hits)
    gpu_w.hits.fill(0)  # (the eager run counted its rows)
    cp.cuda.Stream.null.synchronize()  # (before the replays on the graph's own stream)
    for _ in range(3):
        host = rng.standard_normal((n, H)).astype(np.float32)
        x.set(host, stream=s)
        graph.launch(s)
        s.synchronize()
        cpu_moe(host, cpu_w)
    long = rng.standard_normal((70, H)).astype(np.float32)  # past MOE_DEVICE_ROWS: grouped
    assert_prefill_close(block(cuda_backend, cp.asarray(long), gpu_w), cpu_moe(long, cpu_w))
    assert int(cpu_w.hits.sum()) == (3 * n + 70) * TOP_K
    np.testing.assert_array_equal(gpu_w.hits.get(), cpu_w.hits)


@pytest.mark.parametrize("fmt", ["q8_g32_fp16", "q4_g64_fp16"])
def test_verification_sized_batches_run_on_the_device(fmt: str) -> None:
    """The moe family's CUDA ``block`` on 9..64 rows (a speculative verification) runs
    ``moe_decode`` over 8-row chunks: the CPU reference's values, each chunk exactly what it
    gives alone, and no host read-back (compiled with ``compile_step``: eager, captured,
    replayed)."""
    import cupy as cp

    from ninfer_runtime.backends.cuda.backend import CudaBackend
    from ninfer_runtime.ops.moe.nvrtc import MOE_DEVICE_ROWS

    gpu_w, cpu_w = random_moe(fmt, fused=True, seed=5)
    be = CudaBackend(graphs=True, prefill_precision="float32", decode_precision="split")
    rng = np.random.default_rng(6)
    for n in (9, 24, 48, MOE_DEVICE_ROWS):
        x = cp.asarray(rng.standard_normal((n, H)).astype(np.float32))
        got = block(be, x, gpu_w)
        assert_close(got, cpu_moe(cp.asnumpy(x), cpu_w))
        for a in range(0, n, 8):
            alone = cp.asnumpy(block(be, x[a : a + 8], gpu_w))
            assert np.array_equal(cp.asnumpy(got[a : a + 8]), alone), (n, a)

    n = 48
    x = cp.zeros((n, H), dtype=cp.float32)
    step = be.compile_step(lambda _unused: (block(be, x, gpu_w),), [(1,)])
    for _ in range(3):  # eager, captured, replayed
        host = rng.standard_normal((n, H)).astype(np.float32)
        x.set(host)
        cp.cuda.Device().synchronize()
        (out,) = step(np.zeros(1, dtype=np.int32))
        assert_close(out, cpu_moe(host, cpu_w))
    assert step.graph is not None


def test_prefill_router_is_about_float32() -> None:
    """With bf16 prefill products the router still runs at about float32 accuracy (3xTF32,
    its weight split once and kept on the table), so the top-k choice is the float32 one."""
    import cupy as cp

    from ninfer_runtime.backends.cuda import moe
    from ninfer_runtime.backends.cuda.backend import CudaBackend
    from ninfer_runtime.backends.cuda.moe import ExpertTable

    backend = CudaBackend()  # prefill in bf16
    gpu_w, _ = random_moe("q4_g64_fp16", True)
    table = ExpertTable(gpu_w, backend.join_rows)
    x = np.random.default_rng(5).standard_normal((300, H)).astype(np.float32)
    w = cp.asnumpy(backend.array(table.router_score)).astype(np.float64)
    ref = x.astype(np.float64) @ w.T
    got = cp.asnumpy(moe._router_logits(backend, cp.asarray(x), table))
    bound = 2e-6 * (np.abs(x).astype(np.float64) @ np.abs(w).T) + 1e-30
    assert got.shape == ref.shape and np.all(np.abs(got - ref) <= bound)
    kept = table.router_tf32
    assert kept is not None
    again = cp.asnumpy(moe._router_logits(backend, cp.asarray(x), table))
    assert table.router_tf32 is kept and np.array_equal(again, got)
