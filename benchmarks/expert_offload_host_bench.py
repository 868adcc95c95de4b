"""Expert offload's host path: decode-step tokens/s of one MoE layer whose routed experts all
live in host memory, for a tiny and a mid-sized synthetic expert bank (``--rows``: the step's
token rows, a lane each, each routed to its own top-k), three ways:

* ``whole``: every use decodes the chosen experts' stored codes as whole matrices, then
  multiplies (the first host path);
* ``blocks``: every use decodes and multiplies one intermediate block (128 rows of gate and
  up, 128 columns of down) at a time, never holding a whole decoded matrix (the host path
  for an expert without a decoded copy);
* ``held``: the experts keep decoded float32 copies (``[engine] host_expert_cache``): only
  the products remain;
* ``int4``: the experts repacked for torch's CPU int4 kernel (the moe family's
  ``host_products`` provider ``torch_int4``, the host share beside a GPU): q4 codes as one
  4-bit plane, q5/q6/q8 as two, bf16 rows, codes read inside the product.

Beside each, the host memory bandwidth floor: the bytes a token must read (a step's distinct
chosen experts, over its rows; stored codes for
``whole`` and ``blocks``, float32 weights for ``held``, the packed codes and scales for
``int4``) over the read bandwidth measured in the same run (one large array's maximum, in slices
on every core). ``--kernel-threads`` times the ``int4`` way with each expert's products on
that many cores, the pool running the rest side by side (``all``: every core on one expert at
a time, the engine's default). The machine may be shared: each way runs ``--rounds`` times
and the best round counts.

    python benchmarks/expert_offload_host_bench.py [--format q4_g64_fp16]
        [--down-format q5_g64_fp16] [--kernel-threads all,1,4] [--steps 20] [--rows 1,8]

Copy the table with date, CPU and commit into docs/performance.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import time
from dataclasses import dataclass

import numpy as np

from ninfer_format.codecs.registry import codec_for
from ninfer_runtime.bench.probes import host_read_bandwidth
from ninfer_runtime.expert_offload.host_experts import (
    HostCompute,
    HostExpert,
    HostWeight,
    StoredRows,
    host_threads,
)

LAYOUTS = {
    f: "row_split_k128_v1" for f in ("q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16")
}


@dataclass(frozen=True)
class Bank:
    name: str
    hidden: int
    inner: int  # the experts' intermediate size
    experts: int
    top_k: int


#: the 35B-A3B's experts (2048 x 512, top 8), 64 of its 256 a layer: past the caches, as a
#: layer's host experts are
BANKS = [
    Bank("tiny", 128, 128, 8, 2),
    Bank("mid", 2048, 768, 32, 8),
    Bank("35b-a3b", 2048, 512, 64, 8),
]


def stored(fmt: str, values: np.ndarray) -> StoredRows:
    layout = LAYOUTS[fmt]
    data = codec_for(fmt, layout).encode(values)
    return StoredRows(fmt, layout, np.frombuffer(data, np.uint8), values.shape)


def make_bank(
    bank: Bank, fmt: str, down_fmt: str, rng: np.random.Generator
) -> list[tuple[HostWeight, ...]]:
    """Each expert's gate, up (in ``fmt``) and down (in ``down_fmt``) as stored whole."""
    shapes = [(bank.inner, bank.hidden), (bank.inner, bank.hidden), (bank.hidden, bank.inner)]
    return [
        tuple(
            HostWeight((stored(f, rng.standard_normal(s).astype(np.float32) * 0.05),), None, None)
            for s, f in zip(shapes, (fmt, fmt, down_fmt), strict=True)
        )
        for _ in range(bank.experts)
    ]


def whole(weights: tuple[HostWeight, ...]) -> HostExpert:
    """An expert that decodes its whole matrices at every use (no blocks, no copy)."""
    return HostExpert(*weights, by_blocks=False)


def step_routes(bank: Bank, rows: int, steps: int, seed: int) -> list[np.ndarray]:
    """``steps`` steps' routing: each of ``rows`` rows its own ``top_k`` distinct experts."""
    rng = np.random.default_rng(seed)
    pick = [rng.choice(bank.experts, bank.top_k, replace=False) for _ in range(rows * steps)]
    return [np.stack(pick[i * rows : (i + 1) * rows]) for i in range(steps)]


def distinct_per_row(tops: list[np.ndarray]) -> float:
    """The experts a step reads, over its rows, averaged over the steps."""
    return float(np.mean([len(np.unique(top)) / len(top) for top in tops]))


def tokens_per_second(
    host: HostCompute, experts: dict, bank: Bank, tops: list[np.ndarray], rounds: int
) -> float:
    """Decode steps routed as ``tops`` (rows x top-k each) through the host path, in tokens
    a second, the best of ``rounds`` (the machine is shared: the best round is the least
    disturbed)."""
    rows = len(tops[0])
    x = np.random.default_rng(rows).standard_normal((rows, bank.hidden)).astype(np.float32)
    share = np.full((rows, bank.top_k), 1 / bank.top_k, dtype=np.float32)
    for top in tops:  # warm: the pool's threads, their kernel teams, the experts' pages
        host(x, top, share, experts)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for top in tops:
            host(x, top, share, experts)
        best = min(best, time.perf_counter() - start)
    return rows * len(tops) / best


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def core_splits(text: str) -> list[str]:
    """``--kernel-threads``: each entry ``all`` (every core, the engine's default) or a core
    count."""
    for t in text.split(","):
        if t != "all" and not (t.isdigit() and int(t) > 0):
            raise argparse.ArgumentTypeError(f"{t!r}: expected all or a core count above 0")
    return text.split(",")


def row_counts(text: str) -> list[int]:
    """``--rows``: counts above 0, comma-separated."""
    if not all(t.isdigit() and int(t) > 0 for t in text.split(",")):
        raise argparse.ArgumentTypeError(f"{text!r}: expected row counts above 0, e.g. 1,8")
    return [int(t) for t in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", default="q4_g64_fp16", choices=sorted(LAYOUTS))
    parser.add_argument("--down-format", choices=sorted(LAYOUTS), help="default: --format")
    parser.add_argument(
        "--kernel-threads",
        type=core_splits,
        default="all",
        help="int4 way: cores an expert, comma-separated: all or counts",
    )
    parser.add_argument("--steps", type=int, default=20, help="decode steps a round (mid bank)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds a way; the best is shown")
    parser.add_argument(
        "--rows",
        type=row_counts,
        default="1",
        help="token rows a step, comma-separated (8: eight lanes)",
    )
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    down_format = args.down_format or args.format
    bandwidth = host_read_bandwidth(host_threads())
    kernel = None
    if importlib.util.find_spec("torch") is not None:
        from ninfer_runtime.ops.moe.host_int4 import host_products

        kernel = host_products()
    splits = args.kernel_threads
    host = HostCompute()
    cpu = cpu_name()
    print(f"{cpu}, {host_threads()} threads, gate/up {args.format}, down {down_format}")
    print(f"read bandwidth {bandwidth / 1e9:.2f} GB/s on {host_threads()} threads")
    print(
        "| bank | H x I, E, top-k | rows | way | tokens/s | bytes/token | floor tokens/s "
        "| of floor |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for bank in BANKS:
        weights = make_bank(bank, args.format, down_format, rng)
        blocks = [HostExpert(*w) for w in weights]
        for e in blocks:  # cut now, as a first use would
            assert e.blocks is not None
        held = [HostExpert(*w) for w in weights]
        for e in held:
            e.hold(True)
        # way -> (its experts, the bytes an expert's use reads)
        ways = {
            "whole": (dict(enumerate(whole(w) for w in weights)), blocks[0].nbytes),
            "blocks": (dict(enumerate(blocks)), blocks[0].nbytes),
            "held": (dict(enumerate(held)), blocks[0].decoded_bytes),
        }
        hosts = dict.fromkeys(ways, host)
        if kernel is not None:
            packed = [HostExpert(*w) for w in weights]
            packer = HostCompute(kernel=kernel)
            assert packer.pack(packed) == len(packed)
            packer.close()
            for split in splits:
                way = f"int4 {split}"
                cores = host_threads() if split == "all" else int(split)
                ways[way] = (dict(enumerate(packed)), packed[0].nbytes)
                hosts[way] = HostCompute(kernel=kernel, kernel_threads=cores)
        steps = args.steps if bank.name != "tiny" else args.steps * 20
        for rows in args.rows:
            tops = step_routes(bank, rows, steps, seed=1)
            reads = distinct_per_row(tops)  # experts a token reads
            for way, (table, expert_bytes) in ways.items():
                rate = tokens_per_second(hosts[way], table, bank, tops, args.rounds)
                nbytes = expert_bytes * reads
                floor = bandwidth / nbytes
                print(
                    f"| {bank.name} | {bank.hidden} x {bank.inner}, {bank.experts}, "
                    f"{bank.top_k} | {rows} | {way} | {rate:,.1f} | {nbytes / 1e6:.2f} MB | "
                    f"{floor:,.0f} | {rate / floor:.0%} |"
                )
        for pool in set(hosts.values()) - {host}:
            pool.close()
    host.close()


if __name__ == "__main__":
    main()
