"""Public kernels on gpu_bench.py's shapes, for its ``--anchors`` option: what a well-kept library
reaches on the same weights in the same run, so our products' ratio to it is on record.

* ``tinygemm_int4``: torch's int4 tinygemm (``aten._weight_int4pack_mm``, groups of 64, bf16 x
  and scale/zero pairs), the int4 kernel every torch CUDA build has;
* ``cublas_bf16``: cuBLAS through ``torch.mm`` on bf16 weights, the dense reference.

Each call is captured ``reps`` times in a torch CUDA graph (host launches excluded, as
gpu_bench's own kernels are) and timed with CUDA events, the median of 7 replays; copies of
the weights rotate so that no call finds them in L2. Bytes are the weights as the library
stores them plus x and y, and the floor is those bytes at the run's measured copy bandwidth.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernel_rows import kernel_row, show

#: rotate weight copies until this many bytes (gpu_bench's figure: 8x the L2)
ROTATE_BYTES = 400 << 20
GROUP = 64


def graph_ms(fn: Callable[[], Any], reps: int = 30, warmup: int = 3) -> float:
    """Median ms of one ``fn()``: ``reps`` calls captured in one CUDA graph, 7 replays."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    times.sort()
    return times[len(times) // 2]


def _tinygemm_weights(n: int, k: int) -> tuple[Any, Any, int]:
    """Random int4 codes packed for tinygemm and their bf16 (scale, zero) pairs; bytes."""
    import torch

    codes = torch.randint(0, 16, (n, k), device="cuda", dtype=torch.int32)
    packed = ((codes[:, ::2] << 4) | codes[:, 1::2]).to(torch.uint8)
    del codes
    weight = torch.ops.aten._convert_weight_to_int4pack(packed, 8)
    scales = torch.rand(k // GROUP, n, 2, device="cuda", dtype=torch.bfloat16) * 0.01
    return weight, scales, weight.numel() * weight.element_size() + scales.numel() * 2


def _rotating(copies: list[Any], launch: Callable[[Any], Any]) -> Callable[[], None]:
    turn = [0]

    def call() -> None:
        launch(copies[turn[0] % len(copies)])
        turn[0] += 1

    return call


def anchors(copy_bps: float, shapes: list[tuple[int, int]], rows: tuple[int, ...]) -> list[dict]:
    """One row (gpu_bench's keys) per library kernel, shape and M, printed as measured."""
    import torch

    out = []
    for n, k in shapes:
        first = _tinygemm_weights(n, k)
        count = max(1, -(-ROTATE_BYTES // first[2]))
        tiny = [first] + [_tinygemm_weights(n, k) for _ in range(count - 1)]
        dense_bytes = n * k * 2
        dense = [
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            for _ in range(max(1, -(-ROTATE_BYTES // dense_bytes)))
        ]
        kernels = {
            "tinygemm_int4": (tiny, first[2], "int4_g64 (torch)"),
            "cublas_bf16": (dense, dense_bytes, "bf16 (torch)"),
        }
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            launches = {
                "tinygemm_int4": lambda w: torch.ops.aten._weight_int4pack_mm(x, w[0], GROUP, w[1]),  # noqa: B023
                "cublas_bf16": lambda w: torch.mm(x, w.t()),  # noqa: B023
            }
            for kind, (copies, weight_bytes, fmt) in kernels.items():
                ms = graph_ms(_rotating(copies, launches[kind]))
                nbytes = weight_bytes + 2 * m * (k + n)
                out.append(show(kernel_row(fmt, kind, (n, k), m, ms, nbytes, copy_bps)))
        del tiny, dense, first
        torch.cuda.empty_cache()
    return out
