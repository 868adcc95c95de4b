"""Benchmarks of ninfer_format: open+validate at scale, --verify throughput, decode speed.

    python benchmarks/format_bench.py [--workdir DIR]

Prints a table; copy the numbers with date, machine and commit into docs/performance.md.
"""

from __future__ import annotations

import argparse
import math
import os
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import xxhash

from ninfer_format import Artifact
from ninfer_format.codecs import codec_for
from ninfer_format.framing import ENTRY_MAGIC, HEADER_BYTES, PAGE, align_up
from ninfer_format.jsontext import dump_directory_text
from ninfer_format.verify import verify
from ninfer_format.writer import TensorSpec, place_objects


def sparse_artifact(path: Path, n_objects: int, payload_target: int) -> int:
    """Directory of ``n_objects`` q4 tensors totalling ~``payload_target`` bytes, sparse payload."""
    rows = 128
    k = max(128, align_up(int(payload_target / n_objects / rows / 0.53125), 128))
    specs = [
        TensorSpec(f"w.{i:06d}", (rows, k), "q4_g64_fp16", "row_split_k128_v1")
        for i in range(n_objects)
    ]
    records = place_objects(specs)
    payload = records[-1]["offset"] + records[-1]["bytes"]
    doc = {
        "components": {"text": {"config": {"model_type": "bench"}}},
        "objects": records,
        "bindings": {f"p.{i}": {"object": r["id"]} for i, r in enumerate(records)},
        "uses": [],
        "files": [{"path": None, "payload_bytes": payload}],
    }
    text = dump_directory_text(doc)
    reserve = align_up(HEADER_BYTES + len(text), PAGE) - HEADER_BYTES
    with path.open("wb") as fh:
        fh.write(ENTRY_MAGIC + struct.pack("<Q", reserve) + os.urandom(16))
        fh.write(text + b" " * (reserve - len(text)))
        fh.truncate(HEADER_BYTES + reserve + payload)
    return payload


def timed(fn, repeat: int = 3) -> float:
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--verify-mb", type=int, default=512, help="size of the verify artifact")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ninfer-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []

    big = work / "sparse.ninfer"
    payload = sparse_artifact(big, 100_000, 30 * 10**9)
    t_open = timed(lambda: Artifact.open(big).close())
    rows.append(
        (
            "open+validate, 100k objects, %.1f GB payload" % (payload / 1e9),
            f"{t_open:.3f} s",
            "target < 1 s; payload not read",
        )
    )

    # --verify: a real (non-sparse) artifact of random q4 data, read through the page cache
    from ninfer_format import ArtifactWriter

    n = args.verify_mb * 10**6 // (4096 * 4096 * 17 // 32)
    spec = [
        TensorSpec(f"w{i}", (4096, 4096), "q4_g64_fp16", "row_split_k128_v1")
        for i in range(max(n, 1))
    ]
    codec = codec_for("q4_g64_fp16", "row_split_k128_v1")
    blob = codec.encode(np.random.default_rng(0).standard_normal((4096, 4096), np.float32))
    vpath = work / "verify.ninfer"
    if vpath.exists():
        vpath.unlink()
    with ArtifactWriter(vpath, components={"text": {"config": {}}}, objects=spec, bindings={}) as w:
        for s in spec:
            w.write(s.id, blob)
    size = vpath.stat().st_size
    with Artifact.open(vpath) as art:
        verify(art)  # warm the page cache
        t_verify = timed(lambda: verify(art), 2)
    data = np.frombuffer(blob * 4, dtype=np.uint8)
    t_hash = timed(lambda: xxhash.xxh3_64_hexdigest(data))
    rows.append(
        (
            f"--verify, {size / 1e9:.2f} GB q4 (page cache)",
            f"{size / t_verify / 1e9:.2f} GB/s",
            f"xxh3-64 alone {data.nbytes / t_hash / 1e9:.2f} GB/s",
        )
    )

    rng = np.random.default_rng(1)
    for fmt, layout in (
        ("q4_g64_fp16", "row_split_k128_v1"),
        ("nvfp4", "block_scale_k16_m128x4_v1"),
        ("q8_g32_fp16", "row_split_k128_v1"),
        ("fp8_e4m3fn_row_bf16", "row_scale_v1"),
    ):
        c = codec_for(fmt, layout)
        shape = (4096, 4096)
        enc = np.frombuffer(c.encode(rng.standard_normal(shape, np.float32)), np.uint8)
        t = timed(lambda c=c, enc=enc, shape=shape: c.decode(enc, shape))
        out = 4096 * 4096 * 4
        rows.append(
            (
                f"numpy decode {fmt} [4096,4096]",
                f"{out / t / 1e9:.2f} GB/s out",
                f"{enc.nbytes / t / 1e9:.2f} GB/s in",
            )
        )

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"ninfer_format benchmark, commit {commit}, {os.cpu_count()} CPUs")
    w = max(len(r[0]) for r in rows)
    print(f"{'measurement':<{w}}  {'result':>16}  note")
    for name, value, note in rows:
        print(f"{name:<{w}}  {value:>16}  {note}")


if __name__ == "__main__":
    main()
