"""One timed product as gpu_bench.py records and prints it (ours and the libraries' alike)."""

from __future__ import annotations


def kernel_row(
    fmt: str, kind: str, shape: tuple[int, int], m: int, ms: float, nbytes: int, copy_bps: float
) -> dict:
    """The row of a product of ``shape`` at ``m`` rows that took ``ms`` and moved ``nbytes``,
    with its floor at the run's copy bandwidth ``copy_bps``."""
    floor_ms = nbytes / copy_bps * 1e3
    return {
        "format": fmt,
        "kernel": kind,
        "shape": list(shape),
        "M": m,
        "us": ms * 1e3,
        "MB": nbytes / 1e6,
        "GBps": nbytes / (ms * 1e-3) / 1e9,
        "floor_us": floor_ms * 1e3,
        "pct_floor": 100 * floor_ms / ms,
    }


def show(row: dict) -> dict:
    """Print ``row`` as one table line; returns it."""
    n, k = row["shape"]
    print(
        f"{row['format']:<20} {row['kernel']:<7} {n:>6}x{k:<6} M={row['M']}  {row['us']:8.1f} us  "
        f"{row['MB']:7.1f} MB  {row['GBps']:7.0f} GB/s  floor {row['floor_us']:7.1f} us  "
        f"{row['pct_floor']:5.1f}% of floor",
        flush=True,
    )
    return row
