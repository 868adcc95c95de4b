"""Throughput of the torch quantizers (``ninfer_convert.quantize``) per method and format.

Reports GB/s of BF16 *source* bytes (2 bytes per weight) for a [4096, 4096] matrix, and with
``--large`` also [17408, 5120] (a Qwen3.5-27B MLP projection), on the CPU and, when PyTorch
sees one, on a CUDA device. One warm-up run, then the best of ``--repeat`` timed runs; CUDA
times include the device-to-host copy of the encoded bytes, which the writer needs anyway.

    python benchmarks/quantize_bench.py [--large] [--device cpu|cuda|all] [--repeat 3]
        [--methods grouped_absmax,stored_scale_mse] [--formats q4_g64_fp16,nvfp4]
"""

from __future__ import annotations

import argparse
import time

import torch

from ninfer_convert.quantize import METHODS, quantize


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench(method: str, fmt: str, values: torch.Tensor, repeat: int) -> float:
    """Best wall time of ``repeat`` runs (after one warm-up)."""
    device = str(values.device)
    quantize(method, values, fmt)
    best = float("inf")
    for _ in range(repeat):
        _sync(device)
        started = time.perf_counter()
        quantize(method, values, fmt)
        _sync(device)
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--large", action="store_true", help="also time [17408, 5120]")
    parser.add_argument("--device", default="all", help="cpu, cuda or all (default)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--methods", default="", help="comma-separated subset of methods")
    parser.add_argument("--formats", default="", help="comma-separated subset of formats")
    args = parser.parse_args(argv)

    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    devices = [d for d in devices if d == "cpu" or torch.cuda.is_available()]
    shapes = [(4096, 4096)] + ([(17408, 5120)] if args.large else [])
    methods = args.methods.split(",") if args.methods else list(METHODS)
    formats = set(args.formats.split(",")) if args.formats else None

    print(
        f"torch {torch.__version__}, CPU threads {torch.get_num_threads()}"
        + (f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "")
    )
    header = f"{'method':<18} {'format':<22} {'device':<6} {'shape':<13} {'seconds':>9} {'GB/s':>8}"
    print(header)
    print("-" * len(header))
    for shape in shapes:
        source = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        source = source.to(torch.bfloat16)
        for device in devices:
            values = source.to(device)
            for method in methods:
                for fmt in METHODS[method].formats:
                    if formats is not None and fmt not in formats:
                        continue
                    # int32 takes whole numbers only
                    data = values.round() if fmt == "int32" else values
                    seconds = bench(method, fmt, data, args.repeat)
                    rate = values.numel() * 2 / seconds / 1e9
                    size = f"{shape[0]}x{shape[1]}"
                    print(
                        f"{method:<18} {fmt:<22} {device:<6} {size:<13} "
                        f"{seconds:>9.4f} {rate:>8.3f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
