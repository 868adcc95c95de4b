"""Where and what ran, for the markdown block: date, device, commit, model, the server's flags
and the workload."""

from __future__ import annotations

import argparse
import datetime
import platform
import shlex
import subprocess
from pathlib import Path

from . import ROOT


def device_name(backend: str) -> str:
    """The GPU's name from nvidia-smi (CuPy is not imported for it), else the CPU's."""
    if backend == "cuda":
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        return out.splitlines()[0] if out else "unknown GPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} (CPU)"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def current_commit() -> str:
    """The checkout's short commit, or "unknown" (a copied tree has no git metadata)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def run_meta(args: argparse.Namespace, command: list[str] | None) -> dict[str, str]:
    """Date, device, commit, model, server flags and workload, for the markdown block."""
    if command is None:
        server = f"a running server at {args.url}"
    else:  # the flags of the last level's server, its artifact path shortened
        flags = command[command.index("ninfer_serve") + 2 :]
        server = shlex.join(["ninfer-serve", args.model.name, *flags])
    count = f"{args.num_prompts}" if args.num_prompts else "max(16, 4 x C)"
    baseline = "run in this process before each server" if args.engine_baseline else "not run"
    return {
        "date": datetime.date.today().isoformat(),
        "device": device_name(args.backend) if args.model is not None else "unknown (--url)",
        "commit": args.commit or current_commit(),
        "model": args.model.name if args.model is not None else args.url,
        "backend": args.backend,
        "server": server,
        "workload": (
            f"{count} requests per level of {args.input_words} random words, "
            f"{args.output_len} output tokens each (ignore_eos, greedy), streamed; "
            f"{args.repeat} run(s) per level; engine baseline {baseline}"
        ),
    }
