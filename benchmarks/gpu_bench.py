"""GEMV kernels of the CUDA backend against the memory-bandwidth floor of the device.

    python benchmarks/gpu_bench.py [--json OUT.json] [--formats q4_g64_fp16,...]
        [--tune simt|small|tiles]
        [--shapes 8192x2048,...] [--rows 1,2,4,8,16] [--anchors]

For each packed layout (the 18 ``gguf_*`` block types among them): a random object of the MLP
shapes of a 27B-class model ([17408, 5120] gate/up and [5120, 17408] down), y = x Wᵀ for M = 1
and M = 8 activation rows (``--rows``: any of 1..64, a speculative round's up to 48 among them),
through the linear family's ``product`` (and the SIMT GEMV and the tensor-core kernel beside
it where the tensor-core kernel reads the layout; for the tile-packed formats the tile kernel
on packed copies, as the loader leaves them). Each kernel takes M rows as the engine gives them
to it (``product_kinds``): beyond 8 rows the SIMT GEMV and the tile kernel run 8 rows a launch.
Bytes per call are the object's stored bytes (codes + scales) plus x and y. The floor is those
bytes at the bandwidth of a measured device-to-device copy (read + write bytes per second);
"% of floor" is floor time / kernel time. Several copies of each object rotate so that no
call finds its weights in the 50 MB L2. Calls are captured into a CUDA graph and timed with
CUDA events (median of 7 replays after a warm-up), so host launch overhead is excluded.
``--anchors`` adds torch's int4 tinygemm and cuBLAS bf16 on the same shapes and rows
(``library_anchors.py``). Prints a table; copy it with date, machine and commit into
docs/performance.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from typing import Any

import cupy as cp
import numpy as np
from kernel_rows import kernel_row, show
from product_kinds import check_rows, kinds, launcher, planes_for

from ninfer_format.codecs.gguf_blocks import FORMAT_BLOCKS, set_scales
from ninfer_format.codecs.gguf_blocks import LAYOUT as GGUF_LAYOUT
from ninfer_runtime.backends.cuda import formats as F
from ninfer_runtime.backends.cuda import kernels, split_sums, tile_products
from ninfer_runtime.backends.cuda import tiles as tile_packing

SHAPES = [(17408, 5120), (5120, 17408)]
LAYOUTS = [
    ("q4_g64_fp16", "row_split_k128_v1"),
    ("q5_g64_fp16", "row_split_k128_v1"),
    ("q6_g64_fp16", "row_split_k128_v1"),
    ("q8_g32_fp16", "row_split_k128_v1"),
    ("nf4_g64_fp16", "row_split_k128_v1"),
    ("nvfp4", "block_scale_k16_m128x4_v1"),
    ("fp8_e4m3fn_row_bf16", "row_scale_v1"),
    ("bf16", "contiguous_le_v1"),
    *((name, GGUF_LAYOUT) for name in sorted(FORMAT_BLOCKS)),
]
ROTATE_BYTES = 400 << 20  # rotate copies until this many bytes: 8x the L2


def median_ms(fn, reps: int = 30, warmup: int = 5) -> float:
    """Median time of ``fn``'s GPU work: ``fn`` is captured ``reps`` times into a CUDA graph,
    so host launch overhead (tens of microseconds per CuPy call) is not measured."""
    for _ in range(warmup):
        fn()
    # the timing stream does not wait for the default one: finish any pending work (the
    # random weights of a fresh shape) first, or the first replays time it too
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        for _ in range(reps):
            fn()
        graph = stream.end_capture()
    times = []
    for _ in range(7):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        graph.launch(stream)
        b.record(stream)
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / reps)
    return float(np.median(times))


def eager_ms(fn, calls: int = 10, warmup: int = 3) -> float:
    """Median of ``calls`` eager calls of ``fn``, each timed with CUDA events: host launches
    included, as the engine's prefill issues them (a library's launches cannot be captured
    into CuPy's graphs, so providers are compared this way)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    return float(np.median(times))


_SPIN = cp.RawKernel(
    r"""extern "C" __global__ void spin(long long cycles) {
        long long began = clock64();
        while (clock64() - began < cycles) {}
    }""",
    "spin",
)


def device_ms(fn, calls: int = 10, warmup: int = 3, ahead_ms: float = 200.0) -> tuple[float, float]:
    """(device ms, host ms) a call of ``fn``: ``calls`` calls queued behind a kernel that
    spins for ``ahead_ms``, so the device runs them back to back whatever the host's launch
    time (what a call costs a prefill chunk whose host is ahead of its device), timed with
    CUDA events; and the host's time to issue one. If the host takes longer than the spin to
    issue them all (or a call synchronises), the device time includes its waits."""
    for _ in range(warmup):
        fn()
    khz = cp.cuda.Device().attributes["ClockRate"]
    a, b = cp.cuda.Event(), cp.cuda.Event()
    _SPIN((1,), (1,), (np.int64(ahead_ms * khz),))
    a.record()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - began) * 1e3 / calls
    b.record()
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) / calls, host


def copy_bandwidth(nbytes: int = 2 << 30) -> tuple[float, dict[str, float]]:
    """Bytes read + written per second by the faster of two device-to-device copies of
    ``nbytes`` (cudaMemcpy and CuPy's copy kernel), each timed alone with CUDA events: a
    2 GiB copy takes about a millisecond, so launch overhead does not matter, while inside
    a CUDA graph a memcpy node may be served by a slower copy engine."""
    src = cp.random.randint(0, 255, nbytes // 4, dtype=cp.int32)
    dst = cp.empty_like(src)
    ways = {
        "memcpy": lambda: dst.data.copy_from_device_async(src.data, src.nbytes),
        "copy kernel": lambda: cp.copyto(dst, src),
    }
    rates = {}
    for name, fn in ways.items():
        for _ in range(3):
            fn()
        times = []
        for _ in range(10):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b))
        rates[name] = 2 * src.nbytes / (float(np.median(times)) * 1e-3)
    return max(rates.values()), rates


def random_object(fmt: str, layout: str, shape: tuple[int, int]) -> tuple[cp.ndarray, F.Planes]:
    """Valid, non-degenerate bytes: random codes, finite positive scales, divisor 1."""
    p = F.planes(fmt, layout, shape)
    n, k = shape
    if F.is_gguf(p.code):  # random blocks, every binary16 scale field in [2^-8, 2^-4)
        _, values, block_bytes = FORMAT_BLOCKS[fmt]
        rng = np.random.default_rng(0)
        blocks = rng.integers(0, 256, (n * k // values, block_bytes), dtype=np.uint8)
        set_scales(fmt, blocks, rng.integers(0x1C00, 0x2C00, blocks.shape[0], dtype=np.uint16))
        return cp.asarray(blocks.reshape(-1)), p
    if p.code in F.ROW_SPLIT_CODES.values():
        size = p.off2 + n * p.stride * 2
    elif p.code == F.NVFP4:
        size = p.off2 + 4
    elif p.code == F.FP8:
        size = p.off1 + 2 * n
    else:
        size = 2 * n * k
    data = cp.random.randint(0, 256, size, dtype=cp.int32).astype(cp.uint8)
    if p.code in F.ROW_SPLIT_CODES.values():  # binary16 scales in [2^-8, 2^-4)
        words = cp.random.randint(0x1C00, 0x2C00, n * p.stride, dtype=cp.int32).astype(cp.uint16)
        data[p.off2 :] = words.view(cp.uint8)
    elif p.code == F.NVFP4:  # E4M3FN scales 0.25 .. 8, divisor 1.0
        data[p.off1 : p.off2] = cp.random.randint(0x30, 0x58, p.off2 - p.off1).astype(cp.uint8)
        data[p.off2 :] = cp.asarray(np.frombuffer(np.float32(1).tobytes(), dtype=np.uint8))
    elif p.code == F.FP8:
        codes = data[: n * k]
        codes[(codes & 0x7F) == 0x7F] = 0x3C  # no NaN codes
        data[p.off1 :] = cp.full(n, 0x3C00, dtype=cp.uint16).view(cp.uint8)  # bf16 1/128
    else:  # bf16 values with exponents near 1
        words = data.view(cp.uint16)
        words[...] = (words & 0x807F) | 0x3F00
    return data, p


def _rotating_call(copies: list, launch: Any) -> Any:
    """One product per call, each on the next copy of the weights: ``launch(data)``."""
    turn = [0]

    def call() -> None:
        launch(copies[turn[0] % len(copies)])
        turn[0] += 1

    return call


def _copies(fmt: str, layout: str, shape: tuple[int, int]) -> tuple[list, F.Planes]:
    first, p = random_object(fmt, layout, shape)
    count = max(1, -(-ROTATE_BYTES // first.nbytes))
    return [first] + [random_object(fmt, layout, shape)[0] for _ in range(count - 1)], p


def tune(
    copy_bps: float, formats: list[str] | None = None, shapes: list[tuple[int, int]] = SHAPES
) -> list[dict]:
    """% of floor for every compiled (M, rows per warp R, K split KS) choice at M = 1 and 8
    (default formats: q4, q8, nvfp4, fp8)."""
    rows = []
    chosen = formats or [LAYOUTS[i][0] for i in (0, 3, 5, 6)]
    for fmt, layout in [(f, lay) for f, lay in LAYOUTS if f in chosen]:
        for shape in shapes:
            copies, p = _copies(fmt, layout, shape)
            line = []
            for m, r, ks in kernels.GEMV_CONFIGS:
                if m not in (1, 8):
                    continue
                x = cp.random.standard_normal((m, p.x_width), dtype=cp.float32)
                y = cp.empty((m, shape[0]), dtype=cp.float32)
                n = shape[0]
                launch = lambda d: kernels.gemv(d, p, 0, n, x, y, n, rows_per_warp=r, k_split=ks)  # noqa: E731, B023
                ms = median_ms(_rotating_call(copies, launch))
                pct = 100 * (copies[0].nbytes + x.nbytes + y.nbytes) / copy_bps / (ms * 1e-3)
                rows.append(
                    {"format": fmt, "shape": list(shape), "M": m, "R": r, "KS": ks}
                    | {"us": ms * 1e3, "pct": pct}
                )
                line.append(f"{m}/{r}/{ks} {pct:4.1f}%")
            label = f"tune M/R/KS {fmt:<12} {shape[0]:>5}x{shape[1]:<5}"
            print(label, " ".join(line), flush=True)
    return rows


#: activation rows the tensor-core tiles are compared at (a speculative round has up to 48)
TUNE_SMALL_ROWS = (1, 8, 16, 32, 48)


def tune_small(
    copy_bps: float, formats: list[str] | None = None, shapes: list[tuple[int, int]] = SHAPES
) -> list[dict]:
    """% of floor of the tensor-core kernel for each compiled (R, U) and K slices S (default
    formats: q4, q8)."""
    rows = []
    chosen = formats or [LAYOUTS[i][0] for i in (0, 3)]
    for fmt, layout in [(f, lay) for f, lay in LAYOUTS if f in chosen]:
        for shape in shapes:
            copies, p = _copies(fmt, layout, shape)
            line = []
            for m in TUNE_SMALL_ROWS:
                nt = 1 << max(0, (m - 1).bit_length() - 3)
                for tiles, split in itertools.product(kernels.SMALL_TILES[nt], (None, 4, 16)):
                    if split and split * m * shape[0] > split_sums.PARTIAL_FLOATS:
                        continue
                    x = cp.random.standard_normal((m, p.x_width), dtype=cp.float32)
                    y = cp.empty((m, shape[0]), dtype=cp.float32)
                    n = shape[0]
                    launch = lambda d: kernels.small_gemm(d, p, 0, n, x, y, n, tiles, split)  # noqa: E731, B023
                    ms = median_ms(_rotating_call(copies, launch))
                    nbytes = copies[0].nbytes + x.nbytes + y.nbytes
                    pct = 100 * nbytes / copy_bps / (ms * 1e-3)
                    rows.append(
                        {
                            "format": fmt,
                            "shape": list(shape),
                            "M": m,
                            "R": tiles[0],
                            "U": tiles[1],
                            "split": split,
                            "pct": pct,
                        }
                    )
                    line.append(f"{m}/{tiles[0]}/{tiles[1]}/{split or '-'} {pct:4.1f}%")
            label = f"tune tc M/R/U/S {fmt:<12} {shape[0]:>5}x{shape[1]:<5}"
            print(label, " ".join(line), flush=True)
    return rows


def tune_tiles(
    copy_bps: float, formats: list[str] | None = None, shapes: list[tuple[int, int]] = SHAPES
) -> list[dict]:
    """% of floor of the tile kernel for each block size W and K slices S (the default's
    first), at M = 1, 2, 4, 8 (default formats: q4, q5, q8)."""
    rows = []
    chosen = formats or [LAYOUTS[i][0] for i in (0, 1, 3)]
    for fmt, layout in [(f, lay) for f, lay in LAYOUTS if f in chosen]:
        for shape in shapes:
            copies, p = _copies(fmt, layout, shape)
            if p.code not in tile_packing.TILED_CODES:
                continue
            objs = [tile_packing.pack_tiles(cp, c, p.code, *shape) for c in copies]
            q = tile_packing.tiled_planes(p.code, *shape)
            for m in (1, 2, 4, 8):
                line = []
                x = cp.random.standard_normal((m, q.x_width), dtype=cp.float32)
                y = cp.empty((m, shape[0]), dtype=cp.float32)
                n = shape[0]
                for warps, split in itertools.product(
                    tile_products.BLOCK_WARPS, (None, 1, 2, 4, 8, 16)
                ):
                    launch = lambda d: tile_products.product(d, q, 0, n, x, y, n, split, warps)  # noqa: E731, B023
                    ms = median_ms(_rotating_call(objs, launch))
                    pct = 100 * (objs[0].nbytes + x.nbytes + y.nbytes) / copy_bps / (ms * 1e-3)
                    rows.append(
                        {"format": fmt, "shape": list(shape), "M": m, "S": split, "W": warps}
                        | {"us": ms * 1e3, "pct": pct}
                    )
                    line.append(f"{warps}w{split or '-'} {pct:4.1f}%")
                label = f"tune tiles S {fmt:<12} {shape[0]:>5}x{shape[1]:<5} M={m}"
                print(label, " ".join(line), flush=True)
    return rows


def bench(
    copy_bps: float,
    formats: list[str] | None,
    shapes: list[tuple[int, int]] = SHAPES,
    activation_rows: tuple[int, ...] = (1, 8),
) -> list[dict]:
    rows = []
    for fmt, layout in LAYOUTS:
        if formats and fmt not in formats:
            continue
        for shape in shapes:
            copies, p = _copies(fmt, layout, shape)
            packed = None
            for kind, m in itertools.product(kinds(p), activation_rows):
                q = planes_for(kind, p)
                objs = copies
                if q.tiled:  # as the loader packs them
                    packed = packed or [
                        tile_packing.pack_tiles(cp, c, p.code, *shape) for c in copies
                    ]
                    objs = packed
                x = cp.random.standard_normal((m, q.x_width), dtype=cp.float32)
                y = cp.empty((m, shape[0]), dtype=cp.float32)
                launch = launcher(kind, q)
                ms = median_ms(_rotating_call(objs, lambda d: launch(d, x, y)))  # noqa: B023
                nbytes = objs[0].nbytes + x.nbytes + y.nbytes
                rows.append(show(kernel_row(fmt, kind, shape, m, ms, nbytes, copy_bps)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--formats", help="only these formats (comma-separated names)")
    parser.add_argument(
        "--tune",
        choices=["simt", "small", "tiles"],
        help="also compare the tile choices of a kernel",
    )
    parser.add_argument("--shapes", help="weight shapes ROWSxK,... (default: the 27B MLP's)")
    parser.add_argument("--rows", default="1,8", help="activation row counts M (default 1,8)")
    parser.add_argument(
        "--anchors",
        action="store_true",
        help="also time torch's int4 tinygemm and cuBLAS bf16 on the same shapes and rows",
    )
    args = parser.parse_args()
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    try:
        activation_rows = tuple(int(m) for m in args.rows.split(","))
    except ValueError:
        parser.error(f"--rows {args.rows!r}: expected row counts such as 1,8,16")
    try:  # refused before the kernels compile and the device is touched
        check_rows(activation_rows)
    except ValueError as exc:
        parser.error(str(exc))
    start = time.perf_counter()
    kernels.compile_all()
    compile_s = time.perf_counter() - start
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    copy_bps, ways = copy_bandwidth()
    print(f"device {dev['name'].decode()}, kernels ready in {compile_s:.1f} s")
    detail = ", ".join(f"{name} {bps / 1e9:.0f}" for name, bps in ways.items())
    print(f"device-to-device copy: {copy_bps / 1e9:.0f} GB/s read + write ({detail})")
    formats = args.formats.split(",") if args.formats else None
    rows = bench(copy_bps, formats, shapes, activation_rows)
    if args.anchors:
        from library_anchors import anchors

        rows += anchors(copy_bps, shapes, activation_rows)
    tuning = (
        {"simt": tune, "small": tune_small, "tiles": tune_tiles}[args.tune](
            copy_bps, formats, shapes
        )
        if args.tune
        else []
    )
    if args.json:
        with open(args.json, "w") as fh:
            result = {"copy_GBps": copy_bps / 1e9, "compile_s": compile_s, "rows": rows}
            json.dump({**result, "tuning": tuning}, fh)


if __name__ == "__main__":
    main()
