"""Recording an ``ninfer-bench run`` as a dated markdown section (``--record FILE``).

A record names what the numbers depend on: the date, the device, the source commit (or the
installed version outside a git checkout), the artifact, the K/V storage and the measured
copy bandwidth; then the decode table, the speculative tables (``--spec mtp``), the prefill
line, the profiles and the kernel trace, as the CLI printed them. Sections are appended, so
a file such as ``docs/performance.md`` keeps every run.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from . import kernel_trace, offload_rates

SOURCE_DIR = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RunContext:
    """What a run's numbers depend on besides the rows themselves."""

    date: str
    device: str
    commit: str
    artifact: str
    kv_dtype: str
    copy_gbps: float
    #: the CUDA small-M products' precision (``NINFER_CUDA_DECODE``); "" for the CPU
    decode: str = ""
    #: ops served by a provider forced with ``--provider`` (``family.op=name``, ...)
    forced: str = ""


def device_name(xp: Any) -> str:
    """The GPU's name for CuPy, the host's processor for numpy."""
    if xp.__name__ == "cupy":
        props = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)
        return props["name"].decode()
    return f"CPU ({platform.processor() or platform.machine()})"


def source_commit(source: Path = SOURCE_DIR) -> str:
    """``git describe`` of the source tree (``-dirty`` with uncommitted changes), else the
    installed distribution's version."""
    try:
        out = subprocess.run(
            ["git", "-C", str(source), "describe", "--always", "--dirty", "--abbrev=7"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        try:
            return f"ninfer {metadata.version('ninfer')}"
        except metadata.PackageNotFoundError:
            return "unknown"


def run_context(
    xp: Any,
    artifact: str,
    kv_dtype: str,
    copy_bps: float,
    commit: str | None = None,
    decode: str = "",
    forced: str = "",
) -> RunContext:
    """The context of a run that ends now; ``commit`` overrides ``source_commit()`` (for a
    copy of the tree without its git history); ``decode``: the decode products' precision;
    ``forced``: the ops ``--provider`` forced."""
    now = dt.datetime.now(dt.UTC)
    return RunContext(
        date=now.strftime("%Y-%m-%d %H:%M UTC"),
        device=device_name(xp),
        commit=commit or source_commit(),
        artifact=os.path.basename(artifact),
        kv_dtype=kv_dtype,
        copy_gbps=copy_bps / 1e9,
        decode=decode,
        forced=forced,
    )


def markdown(rows: list[dict[str, Any]], ctx: RunContext) -> str:
    """One section for ``rows`` (the ``--json`` rows of a run)."""
    lines = [
        f"### `ninfer-bench run` {ctx.artifact}, {ctx.date}",
        "",
        f"{ctx.device}, commit {ctx.commit}, K/V {ctx.kv_dtype}, "
        + (f"decode products {ctx.decode}, " if ctx.decode else "")
        + (f"ops forced {ctx.forced}, " if ctx.forced else "")
        + f"device-to-device copy {ctx.copy_gbps:.0f} GB/s (read + write).",
        "",
    ]
    decode = [r for r in rows if r["kind"] == "decode"]
    if decode:
        lines += [
            "| lanes | context | tok/s | ms/step | GB/step | floor ms | % of floor |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['lanes']} | {r['context']} | {r['tokens_per_s']:.1f} | {r['step_ms']:.2f} "
            f"| {r['bytes_per_step'] / 1e9:.2f} | {r['floor_ms']:.2f} "
            f"| {r['percent_of_floor']:.1f}% |"
            for r in decode
        ]
        lines.append("")
    parallel = [r for r in rows if r["kind"] == "decode parallel"]
    if parallel:
        lines += [
            f"Over {parallel[0]['ranks']} ranks (GB/step and floor: rank 0's share):",
            "",
            "| lanes | context | tok/s | ms/step | GB/step | floor ms | % of floor | x one rank |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['lanes']} | {r['context']} | {r['tokens_per_s']:.1f} | {r['step_ms']:.2f} "
            f"| {r['bytes_per_step'] / 1e9:.2f} | {r['floor_ms']:.2f} "
            f"| {r['percent_of_floor']:.1f}% | {r['speedup']:.2f}x |"
            for r in parallel
        ]
        lines.append("")
    lines += _extrapolated_lines(rows)
    lines += _spec_lines(rows)
    lines += _long_prefill_lines(rows)
    for r in rows:
        if r["kind"] == "prefill":
            lines += [
                f"Prefill of {r['tokens']} tokens (chunks of {r['chunk']}): "
                f"{r['tokens_per_s']:.0f} tok/s, {r['seconds']:.2f} s; {r['flops'] / 1e12:.1f} "
                f"TFLOP at a measured {r['matmul_flops'] / 1e12:.0f} TFLOP/s fp16 matmul = "
                f"{r['floor_s']:.2f} s floor ({r['percent_of_floor']:.1f}%).",
                "",
            ]
        elif r["kind"] == "prefill profile":
            spent = ", ".join(
                f"`{name}` {ms:.2f}"
                for name, ms in r.items()
                if name not in ("kind", "tokens", "past")
            )
            lines += [
                f"Prefill profile, one chunk of {r['tokens']} tokens after {r['past']}, ms "
                f"(ablation): {spent}.",
                "",
            ]
        elif r["kind"] == "profile":
            spent = ", ".join(
                f"`{name}` {ms:.3f}" for name, ms in r.items() if name not in ("kind", "lanes")
            )
            lines += [f"Profile, {r['lanes']} lane(s), ms per step (ablation): {spent}.", ""]
        elif r["kind"] == "round profile":
            spent = ", ".join(
                f"`{name}` {ms:.3f}" for name, ms in r.items() if name not in ("kind", "lanes", "k")
            )
            lines += [
                f"Round profile, {r['lanes']} lane(s), K = {r['k']}, ms per round "
                f"(ablation): {spent}.",
                "",
            ]
        elif r["kind"] == "kernel trace":
            lines += [kernel_trace.record_line(r), ""]
        elif r["kind"] == "offload":
            lines += [offload_rates.line(r) + ".", ""]
    return "\n".join(lines)


def _extrapolated_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A reduced artifact's layers by kind and the whole model's step extrapolated from them."""
    whole = [r for r in rows if r["kind"] == "decode extrapolated"]
    if not whole:
        return []
    lines = [
        f"The table above is of an artifact with some of the model's {whole[0]['whole_layers']} "
        "layers. Per layer, measured (what the step saves with the layer bypassed), and the "
        "whole model's step EXTRAPOLATED from them:",
        "",
        "| lanes | context | ms per layer, by kind | whole-model ms/step (extrapolated) | tok/s "
        "| GB/step | floor ms | % of floor |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in whole:
        kinds = ", ".join(f"{k} {ms:.2f}" for k, ms in r["layer_ms"].items())
        lines.append(
            f"| {r['lanes']} | {r['context']} | {kinds} | {r['whole_step_ms']:.2f} "
            f"| {r['whole_tokens_per_s']:.1f} | {r['whole_bytes_per_step'] / 1e9:.2f} "
            f"| {r['whole_floor_ms']:.2f} | {r['whole_percent_of_floor']:.1f}% |"
        )
    return [*lines, ""]


def long_prefill_table(segments: list[dict[str, Any]]) -> list[str]:
    """One long prompt's prefill by part: tok/s and the FLOPs floor as the context grows."""
    lines = [
        "| tokens | tok/s | s | TFLOP | floor s | % of floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['start']}-{r['end']} | {r['tokens_per_s']:.0f} | {r['seconds']:.2f} "
        f"| {r['flops'] / 1e12:.1f} | {r['floor_s']:.3f} | {r['percent_of_floor']:.1f}% |"
        for r in segments
    ]
    return lines


def _long_prefill_lines(rows: list[dict[str, Any]]) -> list[str]:
    segments = [r for r in rows if r["kind"] == "long prefill"]
    if not segments:
        return []
    total = sum(r["seconds"] for r in segments)
    tokens = segments[-1]["end"]
    return [
        f"One {tokens}-token prompt (chunks of {segments[0]['chunk']}): {tokens / total:.0f} "
        f"tok/s, {total:.2f} s in all; by part of the prompt:",
        "",
        *long_prefill_table(segments),
        "",
    ]


def _spec_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The speculative tables: rounds against the plain step, draft steps, acceptance."""
    lines: list[str] = []
    spec = [r for r in rows if r["kind"] == "spec"]
    if spec:
        rates = list(spec[0]["tokens_per_s_at"])
        lines += [
            "Speculative rounds (draft + verify + commit); tok/s (speed-up over the plain "
            "step) at per-position acceptance a:",
            "",
            "| lanes | context | K | ms/step | ms/round | ratio | GB/round | floor ms "
            "| % of floor | plain tok/s | " + " | ".join(f"a={a}" for a in rates) + " |",
            "|---:" * (10 + len(rates)) + "|",
        ]
        lines += [
            f"| {r['lanes']} | {r['context']} | {r['draft_tokens']} | {r['step_ms']:.2f} "
            f"| {r['round_ms']:.2f} | {r['ratio']:.2f}x | {r['bytes_per_round'] / 1e9:.2f} "
            f"| {r['floor_ms']:.2f} | {r['percent_of_floor']:.1f}% "
            f"| {r['plain_tokens_per_s']:.1f} | "
            + " | ".join(
                f"{r['tokens_per_s_at'][a]:.1f} ({r['speedup_at'][a]:.2f}x)" for a in rates
            )
            + " |"
            for r in spec
        ]
        lines.append("")
    draft = [r for r in rows if r["kind"] == "draft"]
    if draft:
        lines += [
            "One draft step (MTP block + head), proposal rows (optimized) vs full vocabulary:",
            "",
            "| lanes | context | proposal rows | optimized ms | floor ms | full ms | floor ms |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['lanes']} | {r['context']} | {r['proposal_rows']} | {r['optimized_ms']:.3f} "
            f"| {r['optimized_floor_ms']:.3f} | {r['full_ms']:.3f} | {r['full_floor_ms']:.3f} |"
            for r in draft
        ]
        lines.append("")
    measured = [r for r in rows if r["kind"] == "acceptance"]
    if measured:
        lines += [
            f"Measured on {measured[0]['prompts']} demo prompts (greedy, one lane, engine):",
            "",
            "| K | tokens | acceptance | tokens/round | tok/s | plain tok/s | speed-up "
            "| same tokens |",
            "|---:|---:|---:|---:|---:|---:|---:|:---|",
        ]
        lines += [
            f"| {r['draft_tokens']} | {r['tokens']} | {100 * r['acceptance']:.1f}% "
            f"| {r['tokens_per_round']:.2f} | {r['tokens_per_s']:.1f} "
            f"| {r['plain_tokens_per_s']:.1f} | {r['speedup']:.2f}x "
            f"| {'yes' if r['same_tokens'] else 'no'} |"
            for r in measured
        ]
        lines.append("")
    return lines


def append(path: str | os.PathLike[str], section: str) -> None:
    """Add ``section`` at the end of ``path`` (created if missing): the new file replaces the
    old one in one rename, so an interrupted write loses neither."""
    target = Path(path)
    old = target.read_text() if target.exists() else ""
    if old and not old.endswith("\n\n"):
        old += "\n" if old.endswith("\n") else "\n\n"
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(old + section.rstrip("\n") + "\n")
        os.chmod(tmp, target.stat().st_mode if target.exists() else 0o644)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
