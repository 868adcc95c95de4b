"""GGUF import speed: ``ninfer-convert`` of a block-keeping recipe beside ``cp`` of the same file.

    python benchmarks/gguf_import_bench.py [--gigabytes 4] [--workdir DIR] [--keep]

Writes a synthetic Q4_K_M-like GGUF of a Qwen3.5 dense model (the 27B's widths; layers,
vocabulary and MLP width chosen to reach the size asked for) and a base directory with its
config.json and a small tokenizer, then times ``cp`` of the file and ``ninfer-convert
--recipe qwen3_8_27b_gguf`` of it into the same directory, and prints MB/s of each and their
ratio. Both read a file the page cache may hold, both write a new file of the same size; the
conversion's time includes starting Python and importing torch, and the fsync of the artifact
before it is published, which ``cp`` does not do: a ``cp`` followed by a ``sync`` of the copy
is timed too. Each timed step starts after a ``sync``, so none pays for another's write-back.
Copy the numbers with date, machine and commit into docs/performance.md.

The blocks are random bytes with small finite scale fields: a pool of a few MB per block type,
repeated, so writing the file costs little more than the disk.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGMLQuantizationType as T

from ninfer_format.codecs.gguf_blocks import set_scales
from ninfer_runtime.bench.geometries import GEOMETRIES
from ninfer_runtime.bench.synthetic import text_resources

RECIPE = "qwen3_8_27b_gguf"
ARCH = "qwen35"
#: bytes of a block of each ggml type written, and the format whose scale fields it has
BLOCKS = {T.Q4_K: (256, 144, "gguf_q4_k"), T.Q6_K: (256, 210, "gguf_q6_k")}
POOL_BLOCKS = 1 << 15  # random blocks per type, repeated to fill every tensor


def text_config(layers: int, vocab: int, intermediate: int) -> dict:
    """The 27B's text config with fewer layers, a smaller vocabulary or MLP (each layer i is
    full attention iff (i + 1) % 4 == 0, as llama.cpp's qwen35 files require)."""
    config = dict(GEOMETRIES["qwen3_6_27b"])
    config.update(num_hidden_layers=layers, vocab_size=vocab, intermediate_size=intermediate)
    config["layer_types"] = [
        "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)
    ]
    return config


def tensors(config: dict) -> list[tuple[str, tuple[int, ...], T]]:
    """Every tensor of the GGUF as (name, shape outermost first, ggml type), Q4_K_M style:
    Q4_K matrices, Q6_K output head and every third ``ffn_down``, F32 vectors and small ones."""
    h, v, m = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    heads, kv, d = (config[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim"))
    nk, nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
    taps = config["linear_conv_kernel_dim"]
    channels = 2 * nk * dk + nv * dv
    out = [
        ("token_embd.weight", (v, h), T.Q4_K),
        ("output.weight", (v, h), T.Q6_K),
        ("output_norm.weight", (h,), T.F32),
    ]
    for i, kind in enumerate(config["layer_types"]):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (h,), T.F32),
            (p + "post_attention_norm.weight", (h,), T.F32),
        ]
        if kind == "full_attention":
            out += [
                (p + "attn_q.weight", (2 * heads * d, h), T.Q4_K),
                (p + "attn_k.weight", (kv * d, h), T.Q4_K),
                (p + "attn_v.weight", (kv * d, h), T.Q6_K),
                (p + "attn_output.weight", (h, heads * d), T.Q4_K),
                (p + "attn_q_norm.weight", (d,), T.F32),
                (p + "attn_k_norm.weight", (d,), T.F32),
            ]
        else:
            out += [
                (p + "attn_qkv.weight", (channels, h), T.Q4_K),
                (p + "attn_gate.weight", (nv * dv, h), T.Q4_K),
                (p + "ssm_alpha.weight", (nv, h), T.F32),
                (p + "ssm_beta.weight", (nv, h), T.F32),
                (p + "ssm_a", (nv,), T.F32),
                (p + "ssm_dt.bias", (nv,), T.F32),
                (p + "ssm_conv1d.weight", (channels, taps), T.F32),
                (p + "ssm_norm.weight", (dv,), T.F32),
                (p + "ssm_out.weight", (h, nv * dv), T.Q4_K),
            ]
        out += [
            (p + "ffn_gate.weight", (m, h), T.Q4_K),
            (p + "ffn_up.weight", (m, h), T.Q4_K),
            (p + "ffn_down.weight", (h, m), T.Q6_K if i % 3 == 0 else T.Q4_K),
        ]
    return out


def tensor_bytes(shape: tuple[int, ...], qtype: T) -> int:
    if qtype == T.F32:
        return 4 * math.prod(shape)
    values, size = BLOCKS[qtype][:2]
    return math.prod(shape) // values * size


def file_bytes(config: dict) -> int:
    return sum(tensor_bytes(s, t) for _, s, t in tensors(config))


def config_for(target: int) -> dict:
    """The 27B's widths with as many layers as fit ``target`` bytes (at least 4); below that,
    a smaller vocabulary, then a narrower MLP."""
    per_layer = (
        file_bytes(text_config(8, 1024, 17408)) - file_bytes(text_config(4, 1024, 17408))
    ) / 4
    fixed = file_bytes(text_config(0, 248320, 17408))
    layers = max(4, round((target - fixed) / per_layer))
    config = text_config(layers, 248320, 17408)
    for vocab in (248320, 131072, 65536, 32768, 16384, 4096):
        for intermediate in (17408, 8704, 4352, 2048, 1024):
            config = text_config(layers, vocab, intermediate)
            if file_bytes(config) <= target * 1.1:
                return config
    return config


def _pool(qtype: T, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of ``qtype`` whose scale fields are small finite binary16 values."""
    _, size, fmt = BLOCKS[qtype]
    blocks = rng.integers(0, 256, (POOL_BLOCKS, size), dtype=np.uint8)
    scales = rng.uniform(2e-4, 2e-3, POOL_BLOCKS).astype(np.float16).view(np.uint16)
    set_scales(fmt, blocks, scales)
    return blocks.reshape(-1)


def _float_values(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if name.endswith("ssm_a"):
        return -np.exp(rng.uniform(0, 2.5, shape)).astype(np.float32)
    if name.endswith("norm.weight") and "ssm_norm" not in name:
        return (1 + 0.01 * rng.standard_normal(shape)).astype(np.float32)
    return (0.02 * rng.standard_normal(shape)).astype(np.float32)


def write_gguf(path: Path, config: dict, seed: int = 0) -> int:
    """The GGUF of ``config`` (header keys as llama.cpp writes them); returns its size."""
    rng = np.random.default_rng(seed)
    pools = {qtype: _pool(qtype, rng) for qtype in BLOCKS}
    listed = tensors(config)
    writer = gguf.GGUFWriter(str(path), ARCH)
    nk, nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    header = {
        "embedding_length": config["hidden_size"],
        "feed_forward_length": config["intermediate_size"],
        "attention.head_count": config["num_attention_heads"],
        "attention.head_count_kv": config["num_key_value_heads"],
        "attention.key_length": config["head_dim"],
        "attention.value_length": config["head_dim"],
        "ssm.conv_kernel": config["linear_conv_kernel_dim"],
        "ssm.state_size": config["linear_key_head_dim"],
        "ssm.group_count": nk,
        "ssm.time_step_rank": nv,
        "ssm.inner_size": nv * config["linear_value_head_dim"],
        "full_attention_interval": 4,
        "block_count": config["num_hidden_layers"],
    }
    for key, value in header.items():
        writer.add_uint32(f"{ARCH}.{key}", value)
    for name, shape, qtype in listed:
        if qtype == T.F32:
            writer.add_tensor_info(name, shape, np.dtype(np.float32), tensor_bytes(shape, qtype))
        else:
            byte_shape = (*shape[:-1], shape[-1] // BLOCKS[qtype][0] * BLOCKS[qtype][1])
            nbytes = tensor_bytes(shape, qtype)
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, shape, qtype in listed:
        if qtype == T.F32:
            writer.write_tensor_data(_float_values(name, shape, rng))
        else:
            writer.write_tensor_data(np.resize(pools[qtype], tensor_bytes(shape, qtype)))
    writer.close()
    return path.stat().st_size


def write_base(directory: Path, config: dict) -> Path:
    """config.json and the synthetic tokenizer files: what a GGUF user's base directory holds."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    for name, data in text_resources().items():
        (directory / name).write_bytes(data)
    return directory


def _timed(command: list[str]) -> float:
    """Wall time of ``command``, after writing back what earlier steps left dirty (so one
    step's write-back is not charged to the next)."""
    os.sync()
    started = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - started


def _convert_command(gguf_path: Path, base: Path, output: Path) -> list[str]:
    tool = Path(sys.executable).with_name("ninfer-convert")
    return [
        str(tool), "--recipe", RECIPE, "--source", f"base={base}",
        "--source", f"gguf={gguf_path}", "-o", str(output), "--force", "--quiet",
    ]  # fmt: skip


def _remove_artifact(entry: Path) -> None:
    for path in entry.parent.glob(entry.name + "*"):
        path.unlink()


def _remove_written(work: Path, made: bool) -> None:
    """What a run wrote into ``work``: the whole directory when the run made it, else only its
    own files (a ``--workdir`` given may hold others)."""
    if made:
        shutil.rmtree(work, ignore_errors=True)
        return
    base = work / "base"
    written = [work / "synthetic.gguf", work / "copy.gguf", base / "config.json"]
    written += [base / name for name in text_resources()]
    for path in written:
        path.unlink(missing_ok=True)
    _remove_artifact(work / "synthetic.ninfer")
    if base.is_dir() and not any(base.iterdir()):
        base.rmdir()


def _synthetic(work: Path, gigabytes: float) -> tuple[Path, Path, int]:
    """The GGUF and base directory in ``work``; a GGUF already there of this config is reused."""
    config = config_for(int(gigabytes * 1e9))
    gguf_path, base = work / "synthetic.gguf", work / "base"
    written = base / "config.json"
    same = gguf_path.is_file() and written.is_file() and json.loads(written.read_text()) == config
    write_base(base, config)
    if same:
        return gguf_path, base, gguf_path.stat().st_size
    started = time.perf_counter()
    size = write_gguf(gguf_path, config)
    print(
        f"wrote {gguf_path} ({size / 1e9:.2f} GB, {config['num_hidden_layers']} layers, "
        f"vocab {config['vocab_size']}) in {time.perf_counter() - started:.1f} s"
    )
    return gguf_path, base, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--gigabytes", type=float, default=4.0, help="size of the GGUF (GB, 1e9)")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each side; the best counts")
    ap.add_argument("--workdir", type=Path, default=None, help="default: a new temporary one")
    ap.add_argument("--keep", action="store_true", help="keep the files written (and reuse them)")
    args = ap.parse_args()
    made = args.workdir is None
    work = Path(tempfile.mkdtemp(prefix="ninfer-gguf-bench-") if made else args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    copy, output = work / "copy.gguf", work / "synthetic.ninfer"
    try:
        gguf_path, base, size = _synthetic(work, args.gigabytes)
        t_cp = t_durable = t_convert = inside = math.inf
        for _ in range(args.repeat):  # alternated, so all sides see the same machine
            t_cp = min(t_cp, _timed(["cp", str(gguf_path), str(copy)]))
            copy.unlink()
            # the artifact is fsynced before it is published: the same for the copy
            durable = ["sh", "-c", f"cp '{gguf_path}' '{copy}' && sync '{copy}'"]
            t_durable = min(t_durable, _timed(durable))
            copy.unlink()
            _remove_artifact(output)  # as the copy is removed: no old file to delete
            took = _timed(_convert_command(gguf_path, base, output))
            if took < t_convert:
                report = json.loads(output.with_name(output.name + ".conversion.json").read_text())
                t_convert, inside = took, report["seconds"]
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(
            f"GGUF import benchmark, commit {commit}, {os.cpu_count()} CPUs (load {load}), "
            f"{size / 1e9:.2f} GB, best of {args.repeat}, page cache warm"
        )
        print(f"{'step':<36} {'seconds':>8} {'MB/s':>8}")
        print(f"{'cp':<36} {t_cp:>8.2f} {size / t_cp / 1e6:>8.0f}")
        print(f"{'cp, then sync of the copy':<36} {t_durable:>8.2f} {size / t_durable / 1e6:>8.0f}")
        print(f"{'ninfer-convert ' + RECIPE:<36} {t_convert:>8.2f} {size / t_convert / 1e6:>8.0f}")
        print(f"{'  in convert(), before fsync+publish':<36} {inside:>8.2f} {'':>8}")
        print(
            f"convert / cp throughput: {t_cp / t_convert:.2f}; "
            f"convert / (cp, sync): {t_durable / t_convert:.2f}"
        )
    finally:
        if not args.keep:
            _remove_written(work, made)


if __name__ == "__main__":
    main()
