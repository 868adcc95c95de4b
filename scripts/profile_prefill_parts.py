"""Where a prefill chunk's products and MoE blocks spend their time, part by part (CUDA).

    python scripts/profile_prefill_parts.py ARTIFACT [--tokens 2048]

For the first GDN layer and the first full-attention layer of the artifact: each projection's
segments timed as bf16 dequantization alone, the cuBLAS product alone, and ``linear`` whole,
beside the floors (bytes read and written at the measured copy bandwidth; FLOPs at the
measured fp16 matmul rate). For a MoE layer, the stages of ``moe.moe_prefill``. Medians of
5 runs, device time by CUDA events. A development aid: ``ninfer-bench run --profile-prefill``
is the op-level profile.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _ms(fn: Any, repeats: int = 5) -> float:
    import cupy as cp

    fn()
    times = []
    for _ in range(repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def _segment(seg: Any, xb: Any, rate: float, bw: float) -> str:
    import cupy as cp

    from ninfer_runtime.backends.cuda import kernels, prefill

    p, m = seg.parent.planes, xb.shape[0]
    n, k = seg.rows, p.columns
    flop = 2 * m * n * k
    y = cp.empty((m, n), dtype=cp.float32)
    deq = 0.0
    if prefill.is_bf16(p):
        wb = prefill.bf16_rows(seg.parent.data, p, seg.row0, seg.rows)
    else:
        wb = cp.empty((n, k), dtype=cp.uint16)
        rows = cp.arange(seg.row0, seg.row0 + n, dtype=cp.int32)
        deq = _ms(lambda: kernels.dequant_rows(seg.parent.data, p, rows, wb))
    gemm = _ms(lambda: prefill.gemm_bf16(wb, xb, y))
    packed = seg.parent.data.nbytes * n // max(p.rows, 1)
    deq_floor = (packed + 2 * n * k) / bw * 1e3
    return (
        f"{n}x{k} code {p.code}: dequant {deq:7.3f} ms (floor {deq_floor:6.3f})  "
        f"gemm {gemm:7.3f} ms (floor {flop / rate * 1e3:6.3f}, {flop / gemm / 1e9:4.0f} TFLOP/s)"
    )


def _products(be: Any, name: str, w: Any, x: Any, rate: float, bw: float) -> None:
    from ninfer_runtime.backends.cuda import prefill

    xb = prefill.to_bf16(x)
    for i, seg in enumerate(w.segments):
        print(f"  {name}[{i}] {_segment(seg, xb, rate, bw)}")
    print(f"  {name} linear whole: {_ms(lambda: be.linear(x, w)):.3f} ms")


def _kernel_times(module: Any, fn: Any) -> dict[str, float]:
    """ms of each kernel ``fn()`` launches through ``module.function`` (events around each
    launch, in stream order), summed by kernel name."""
    import cupy as cp

    original, pending = module.function, []

    def timed(family: str, name: str, **kw: Any) -> Any:
        kernel = original(family, name, **kw)

        class Timed:
            ptr = kernel.ptr

            def __call__(self, *args: Any, **kwargs: Any) -> None:
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                kernel(*args, **kwargs)
                end.record()
                pending.append((name, start, end))

        return Timed()

    fn()  # warm
    module.function = timed
    try:
        fn()
    finally:
        module.function = original
    cp.cuda.Device().synchronize()
    out: dict[str, float] = {}
    for name, start, end in pending:
        out[name] = out.get(name, 0.0) + cp.cuda.get_elapsed_time(start, end)
    return out


def _gdn_parts(be: Any, mixer: Any, tokens: int) -> None:
    import cupy as cp

    from ninfer_runtime.backends.cuda import gdn_prefill

    c, rng = mixer.c, np.random.default_rng(4)
    mixed = cp.asarray(rng.standard_normal((tokens, c.conv_channels)), cp.float32)
    g = cp.asarray(-np.abs(rng.standard_normal((tokens, c.value_heads))) * 0.1, cp.float32)
    beta = cp.asarray(rng.random((tokens, c.value_heads)), cp.float32)
    conv = cp.zeros((1, c.conv_channels, mixer.convolution.shape[0] - 1), cp.float32)
    state = cp.zeros((1, c.value_heads, c.key_dim, c.value_dim), cp.float32)
    lane = ((0, tokens, 0),)

    def run() -> Any:
        op = mixer._op("prefill")
        return op(mixed, mixer.convolution, conv, g, beta, state, lane, **mixer._dims)

    print(f"  gdn_prefill whole: {_ms(run):.3f} ms")
    for name, ms in _kernel_times(gdn_prefill, run).items():
        print(f"  gdn_prefill {name:28s} {ms:8.3f} ms")


def _moe_stages(be: Any, table: Any, x: Any) -> None:
    import cupy as cp

    from ninfer_runtime.backends.cuda import moe, moe_experts, moe_routing

    k, inter = table.top_k, table.intermediate
    stages: dict[str, Any] = {}

    def router() -> Any:  # as the prefill runs it: the weight's split kept on the table
        return moe._router_logits(be, x, table)

    logits = cp.ascontiguousarray(router(), dtype=cp.float32)
    stages["router"] = router
    stages["router (float32)"] = lambda: x @ be.array(table.router_score).T
    stages["route"] = lambda: moe.route(logits, k, table.experts)
    ids, shares = moe.route(logits, k, table.experts)
    tc = moe._tensor_core_groups(table)
    size = moe.TENSOR_GROUP_PAIRS if tc else moe.GROUP_PAIRS
    stages["pair_groups"] = lambda: moe.PairGroups.of(ids, table.experts, size)
    groups = moe.PairGroups.of(ids, table.experts, size)
    if tc:
        xs, x_rows = x, groups.source
    else:
        xs = cp.empty((groups.rows, x.shape[1]), dtype=cp.float32)

        def scatter() -> None:
            xs[groups.row] = cp.repeat(x, k, axis=0)

        stages["scatter"] = scatter
        x_rows = None
    xs = moe._padded(xs, table.gate.planes)
    gu = cp.empty((groups.rows, 2 * inter), dtype=cp.float32)
    project = moe.partial(moe._grouped, groups=groups, tensor_cores=tc)
    rows = 2 * inter if table.fused else None
    stages["gate_up" if table.fused else "gate"] = lambda: project(
        table.gate, xs, gu, 2 * inter, rows, x_rows
    )
    h = moe.silu_mul(gu, inter, inter, table.down.planes.x_width)
    stages["silu_mul"] = lambda: moe.silu_mul(gu, inter, inter, table.down.planes.x_width)
    if tc and table.fused:  # what the prefill runs: silu(gate) * up inside the product
        stages["gate_up gated"] = partial(
            moe.kernels.small_gemm_groups,
            table.gate.base,
            table.gate.row0,
            groups.expert,
            table.gate.planes,
            inter,
            xs,
            h,
            table.down.planes.x_width,
            x_rows,
            groups.live,
            gated=True,
        )
    ys = cp.empty((groups.rows, table.hidden), dtype=cp.float32)
    stages["down"] = lambda: project(table.down, h, ys, table.hidden)
    for config in moe.kernels.GROUP_CONFIGS if tc else ():  # each compiled configuration
        other = moe.PairGroups.of(ids, table.experts, 8 * config[0])
        hidden = moe._hidden_rows(other.rows, inter, table.down.planes.x_width)
        out = cp.empty((other.rows, table.hidden), dtype=cp.float32)
        gate, down = table.gate, table.down
        stages[f"gate_up {config}"] = partial(
            moe.kernels.small_gemm_groups, gate.base, gate.row0, other.expert, gate.planes,
            inter, xs, hidden, table.down.planes.x_width, other.source, other.live,
            gated=True, config=config,
        )  # fmt: skip
        stages[f"down {config}"] = partial(
            moe.kernels.small_gemm_groups, down.base, down.row0, other.expert, down.planes,
            table.hidden, hidden, out, table.hidden, group_rows=other.live, config=config,
        )  # fmt: skip
    for config in moe.kernels.GROUP_CONFIGS if table.shared_groups else ():
        stages[f"shared {config}"] = partial(_shared_with, be, x, table, config)
    shared = moe._shared_prefill(be, x, table)
    stages["shared (grouped)" if table.shared_groups else "shared"] = lambda: moe._shared_prefill(
        be, x, table
    )
    stages["shared (linear)"] = lambda: moe._shared(be, x, table)
    stages["combine"] = lambda: moe._combine(x, table, logits, ys, shares, shared, groups.row)
    stages["whole"] = lambda: moe.moe_prefill(be, x, table)
    real = int((groups.live > 0).sum())
    computed = int((-(-groups.live // 8) * 8).sum())
    print(
        f"  MoE: {real} groups of up to {size} pairs ({groups.expert.size} launched), "
        f"{int(groups.live.sum())} pairs in {computed} computed rows, tensor cores {tc}"
    )
    for name, fn in stages.items():
        print(f"  moe {name:15s} {_ms(fn):8.3f} ms")
    whole = stages["whole"]
    for module in (moe, moe_routing, moe_experts, moe.kernels):  # each launches its kernels
        for name, ms in _kernel_times(module, whole).items():
            print(f"  moe kernel {name:40s} {ms:8.3f} ms")


def _shared_with(be: Any, x: Any, table: Any, config: tuple[int, int, int]) -> Any:
    """The shared expert's grouped prefill with another configuration."""
    from ninfer_runtime.backends.cuda import moe

    default, moe.SHARED_GROUPS = moe.SHARED_GROUPS, config
    try:
        return moe._shared_prefill(be, x, table)
    finally:
        moe.SHARED_GROUPS = default


def _chunk_once(model: Any, tokens: int, host_profile: bool) -> None:
    """One prefill chunk of ``tokens`` tokens timed (wall clock, and how long the host took
    to issue it), then once more inside cudaProfilerStart/Stop: under ``ncu
    --profile-from-start off --metrics gpu__time_duration.sum`` the sum of its kernels'
    device times, set against the wall clock, says how long the device waited for the host.
    ``host_profile``: that last run under cProfile instead, its functions by own time."""
    import cProfile
    import pstats
    import time

    import cupy as cp

    from ninfer_runtime.runner import ModelRunner

    runner = ModelRunner(model)
    ids = np.random.default_rng(3).integers(0, model.config.vocab, tokens)

    def chunk() -> tuple[float, float]:
        state = runner.new_state(tokens + 1)
        cp.cuda.Device().synchronize()
        began = time.perf_counter()
        runner.forward([ids], [state], last_only=True)
        issued = time.perf_counter()
        cp.cuda.Device().synchronize()
        return 1e3 * (issued - began), 1e3 * (time.perf_counter() - began)

    chunk()
    times = [chunk() for _ in range(3)]
    issued, wall = (float(np.median(t)) for t in zip(*times, strict=True))
    print(f"chunk of {tokens} tokens: {wall:.2f} ms wall, issued by the host in {issued:.2f} ms")
    if host_profile:
        profile = cProfile.Profile()
        profile.runcall(chunk)
        pstats.Stats(profile).sort_stats("tottime").print_stats(50)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(50)
        return
    cp.cuda.profiler.start()
    chunk()
    cp.cuda.profiler.stop()
    print("chunk profiled once")


def _moe_once(be: Any, model: Any, x: Any) -> None:
    import cupy as cp

    from ninfer_runtime.backends.cuda import moe
    from ninfer_runtime.models.qwen3_5.mlp import SparseMoe
    from ninfer_runtime.ops.moe.nvrtc import expert_table

    layer = next((la for la in model.layers if isinstance(la.ffn, SparseMoe)), None)
    if layer is None:
        raise click.ClickException("the artifact has no MoE layer")
    table = expert_table(be, layer.ffn.weights)
    moe.moe_prefill(be, x, table)
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.start()
    moe.moe_prefill(be, x, table)
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.stop()
    print("moe_prefill profiled once")


@click.command()
@click.argument("artifact", type=click.Path(exists=True, dir_okay=False))
@click.option("--tokens", type=int, default=2048, show_default=True)
@click.option(
    "--moe-once",
    is_flag=True,
    help="only run the first MoE layer's prefill twice, the second inside cudaProfilerStart/"
    "Stop (for `ncu --profile-from-start off`)",
)
@click.option(
    "--chunk-once",
    is_flag=True,
    help="time one whole prefill chunk, then run it once inside cudaProfilerStart/Stop",
)
@click.option(
    "--host-profile",
    is_flag=True,
    help="with --chunk-once: the last run under cProfile (where the host's time goes)",
)
def main(artifact: str, tokens: int, moe_once: bool, chunk_once: bool, host_profile: bool) -> None:
    from ninfer_runtime.backends.cuda import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        raise click.ClickException(reason)
    import cupy as cp

    from ninfer_format import Artifact, ArtifactError
    from ninfer_runtime.backends.cuda.backend import CudaBackend
    from ninfer_runtime.bench import measure as M
    from ninfer_runtime.errors import EngineError
    from ninfer_runtime.models import load_model
    from ninfer_runtime.models.qwen3_5.attention import GatedAttention
    from ninfer_runtime.models.qwen3_5.mlp import SparseMoe
    from ninfer_runtime.ops.moe.nvrtc import expert_table

    be = CudaBackend()
    try:
        model = load_model(Artifact.open(artifact), be)
    except (ArtifactError, EngineError) as exc:
        raise click.ClickException(str(exc)) from None
    rate, bw = M.matmul_rate(cp), M.copy_bandwidth(cp)
    print(f"fp16 matmul {rate / 1e12:.0f} TFLOP/s, copy {bw / 1e9:.0f} GB/s, {tokens} rows")
    x = cp.asarray(
        np.random.default_rng(0).standard_normal((tokens, model.config.hidden)), cp.float32
    )
    if moe_once:
        _moe_once(be, model, x)
        return
    if chunk_once:
        _chunk_once(model, tokens, host_profile)
        return
    seen: set[str] = set()
    for i, layer in enumerate(model.layers):
        kind = type(layer.mixer).__name__
        if kind in seen:
            continue
        seen.add(kind)
        print(f"layer {i} ({kind})")
        mixer = layer.mixer
        width = mixer.output.shape[1]
        _products(be, "projections", mixer.projections, x, rate, bw)
        xo = cp.asarray(np.random.default_rng(1).standard_normal((tokens, width)), cp.float32)
        _products(be, "output", mixer.output, xo, rate, bw)
        if not isinstance(mixer, GatedAttention):
            _gdn_parts(be, mixer, tokens)
        if isinstance(layer.ffn, SparseMoe):
            _moe_stages(be, expert_table(be, layer.ffn.weights), x)
        else:
            _products(be, "gate_up", layer.ffn.gate_up, x, rate, bw)
            inner = layer.ffn.down.shape[1]
            xd = cp.asarray(np.random.default_rng(2).standard_normal((tokens, inner)), cp.float32)
            _products(be, "down", layer.ffn.down, xd, rate, bw)
        if isinstance(mixer, GatedAttention) and len(seen) == 2:
            break


if __name__ == "__main__":
    main()
