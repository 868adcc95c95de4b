"""The ``kills`` family: ``ninfer-convert --force`` of the bundled model over an existing
artifact (sharded and single-file), killed with SIGKILL at random times, killed at the N-th
rename and failed with EIO at the N-th rename.

A failure is a target that is not the old or the new artifact whole, a report that describes
another artifact, a traceback for an OS error, or stray files that a later completed run leaves
in place.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .bookkeeping import Budget, Tally, short
from .paths import BUNDLED, ROOT

#: Runs ``ninfer-convert`` with ``os.replace``/``os.rename`` counted (one line per call in the
#: log) and, at call ``at``, the process SIGKILLed ("kill") or the call failed with EIO ("eio").
LAUNCHER = """
import errno, os, signal, sys
mode, at, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
calls = [0]
def faulty(real):
    def rename(src, dst, *args, **kwargs):
        calls[0] += 1
        with open(log, "a") as fh:
            fh.write(f"{calls[0]} {os.fspath(dst)}\\n")
        if calls[0] == at and mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if calls[0] == at and mode == "eio":
            raise OSError(errno.EIO, os.strerror(errno.EIO), os.fspath(src))
        return real(src, dst, *args, **kwargs)
    return rename
os.replace, os.rename = faulty(os.replace), faulty(os.rename)
sys.argv = ["ninfer-convert", *sys.argv[4:]]
from ninfer_convert.cli import main
main()
"""
OLD_RECIPE, NEW_RECIPE = "qwen3_5_bf16", "tiny_q8"
LAYOUTS = {"sharded": 256 * 1024, "single": 0}


@dataclass
class Run:
    status: int | None  # None: killed by us
    stderr: str
    renames: int
    seconds: float


def _convert(target: Path, recipe: str, limit: int, mode: str, at: int, kill_after: float) -> Run:
    log = target.parent / "renames.log"
    log.unlink(missing_ok=True)
    args = ["--recipe", recipe, "--source", str(BUNDLED), "-o", str(target), "--force"]
    args += ["--shard-limit", str(limit), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, mode, str(at), str(log), *args],
        cwd=target.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    killed = False
    try:
        _, stderr = proc.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        _, stderr = proc.communicate()
        killed = True
    renames = len(log.read_text().splitlines()) if log.exists() else 0
    log.unlink(missing_ok=True)
    status = None if killed else proc.returncode
    return Run(status, stderr, renames, time.monotonic() - started)


def _artifact_files(entry: Path) -> set[str]:
    """Names the entry's directory lists, plus its report (empty if the entry is unreadable)."""
    from ninfer_format import Artifact
    from ninfer_format.errors import ArtifactError

    try:
        with Artifact.open(entry) as art:
            parts = {f.path for f in art.directory.files if f.path}
    except ArtifactError:
        return set()
    return {entry.name, f"{entry.name}.conversion.json", *parts}


def _whole(entry: Path) -> tuple[str | None, str]:
    """(problem, recipe): the target must open, verify strictly and match its report."""
    from ninfer_format import Artifact
    from ninfer_format.errors import ArtifactError
    from ninfer_format.verify import verify

    try:
        with Artifact.open(entry) as art:
            report = verify(art, strict=True)
            recipe = str(art.provenance.get("recipe"))
            artifact_id = art.artifact_id.hex()
    except ArtifactError as exc:
        return f"target does not open: {short(str(exc), 200)}", ""
    if not report.ok:
        return f"target fails verification: {short(report.errors[0], 200)}", recipe
    if recipe not in (OLD_RECIPE, NEW_RECIPE):
        return f"target holds recipe {recipe!r}", recipe
    sidecar = entry.with_name(entry.name + ".conversion.json")
    try:
        described = json.loads(sidecar.read_text()).get("artifact_id")
    except FileNotFoundError:  # no report is better than a wrong one
        described = artifact_id
    except (OSError, ValueError):
        described = None
    if described != artifact_id:
        return f"{sidecar.name} describes artifact {described}, the entry is {artifact_id}", recipe
    return None, recipe


def _stray(entry: Path) -> list[str]:
    keep = _artifact_files(entry) | {"renames.log"}
    return sorted(p.name for p in entry.parent.iterdir() if p.name not in keep)


def _describe_strays(entry: Path, strays: list[str]) -> str:
    """How many are temporary files, parts of a replaced artifact, or other; with examples."""
    groups: dict[str, list[str]] = {}
    for name in strays:
        if name.startswith(f".{entry.name}"):
            kind = "temporary files"
        elif name.startswith(f"{entry.name}.part-"):
            kind = "parts the new artifact does not list"
        else:
            kind = "other files"
        groups.setdefault(kind, []).append(name)
    return "; ".join(f"{len(v)} {k} (e.g. {v[0]})" for k, v in groups.items())


def _restore(entry: Path, pristine: Path) -> None:
    """Put the old artifact back; hidden temporary files stay, for later runs to clean."""
    for p in entry.parent.iterdir():
        if p.name.startswith(entry.name):
            p.unlink()
    for p in pristine.iterdir():
        shutil.copy2(p, entry.parent / p.name)


def _fault_plan() -> Iterator[tuple[str, str, int]]:
    """(layout, mode, at) forever: a kill before each rename in turn, an EIO at each rename
    in turn and a kill at a random time, interleaved; three sharded cases to one single-file.
    Each rename stream starts at the second rename, the first with one file already replaced;
    ``attack_kills`` wraps ``at`` past the last rename round to the first."""
    at = {(mode, layout): 2 for mode in ("kill", "eio") for layout in LAYOUTS}
    for turn in itertools.count():
        layout = "sharded" if turn % 4 < 3 else "single"
        mode = ("kill", "eio", "random")[turn % 3]
        if mode == "random":
            yield layout, mode, 0
        else:
            yield layout, mode, at[(mode, layout)]
            at[(mode, layout)] += 1


def attack_kills(budget: Budget, rng: random.Random, work: Path, tally: Tally) -> None:
    seconds = 2.5  # one conversion, until one is timed
    renames = dict.fromkeys(LAYOUTS, 0)  # how many a complete run makes, once seen
    pristine: dict[str, Path] = {}
    for layout, mode, at in _fault_plan():
        if not pristine or (layout not in pristine and budget.left() >= 3 * seconds):
            pristine[layout], seconds = _build_pristine(work / f"old-{layout}", LAYOUTS[layout])
        if tally.cases and budget.left() < 2 * seconds:  # this case and the closing run
            break
        if layout not in pristine:
            continue
        if mode != "random" and renames[layout]:
            at = (at - 1) % renames[layout] + 1  # every rename had its turn: go round again
        target = work / layout / "m.ninfer"
        target.parent.mkdir(exist_ok=True)
        _restore(target, pristine[layout])
        before = set(_stray(target))
        if mode == "random":
            delay = rng.uniform(0.2, seconds * 1.1)
            run = _convert(target, NEW_RECIPE, LAYOUTS[layout], "none", 0, delay)
            what = f"{layout}: SIGKILL after {delay:.2f} s"
        else:
            run = _convert(target, NEW_RECIPE, LAYOUTS[layout], mode, at, budget.left())
            what = f"{layout}: {'SIGKILL before' if mode == 'kill' else 'EIO at'} rename {at}"
        if run.status == 0:
            seconds, renames[layout] = run.seconds, run.renames
            if mode != "random":
                what += f" (not reached: a complete run makes {run.renames})"
        problem = _check_run(target, run, mode)
        tally.case(problem and f"{problem} <- {what}")
        new_strays = set(_stray(target)) - before
        if new_strays and run.status != 0:
            tally.notes.append(f"{what}: left {len(new_strays)} stray files")
    for layout in pristine:  # a complete run after the faults: do later runs clean up?
        if budget.left() < seconds:
            break
        target = work / layout / "m.ninfer"
        run = _convert(target, NEW_RECIPE, LAYOUTS[layout], "none", 0, budget.left())
        problem = _check_run(target, run, "none")
        tally.case(problem and f"{problem} <- {layout}: a complete run after the faults")


def _build_pristine(folder: Path, limit: int) -> tuple[Path, float]:
    """The old artifact, kept aside to restore before each case; and how long it took."""
    folder.mkdir(parents=True, exist_ok=True)
    run = _convert(folder / "m.ninfer", OLD_RECIPE, limit, "none", 0, 120)
    if run.status != 0:
        raise RuntimeError(f"could not convert the bundled model:\n{run.stderr}")
    return folder, run.seconds


def _check_run(target: Path, run: Run, mode: str) -> str | None:
    problem, recipe = _whole(target)
    if problem:
        return problem
    if run.status == 0 and recipe != NEW_RECIPE:
        return "the run succeeded but the target is the old artifact"
    if "Traceback" in run.stderr:
        last = run.stderr.strip().splitlines()[-1]
        return f"ninfer-convert printed a traceback ({short(last, 120)})"
    if run.status is not None and run.status != 0 and mode == "eio":
        lines = [ln for ln in run.stderr.strip().splitlines() if ln.strip()]
        if len(lines) != 1:
            return f"ninfer-convert said {len(lines)} lines for one OS error"
    strays = _stray(target) if run.status == 0 else []
    if strays:
        return f"a completed run left stray files: {_describe_strays(target, strays)}"
    return None
